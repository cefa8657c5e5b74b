"""Readers and writers of every format: round trips over dtypes, orders, chunkings and edge shapes."""

from __future__ import annotations

import io

import numpy as np
import pytest
import scipy.io
import zarr

import blocklin
from blocklin.errors import DTypeError, FormatError
from blocklin.storage.formats import detect_format, open_reader, open_writer
from blocklin.storage.location import split_spec

DTYPES = ["float32", "float64", "int32", "int64"]
# format -> (extension, dtype it reads back as for each source dtype, or None to keep)
TEXT_BACK = {"f": "float64", "i": "int64"}


def _matrix(rng, shape, dtype):
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    return rng.integers(-(2**30), 2**30, size=shape).astype(dt)


def _read_back(path, fmt, shape, dtype, **kw):
    with open_reader(path, **kw) as r:
        assert r.shape == tuple(shape)
        return r.read(slice(0, shape[0]), slice(0, shape[1])), r.dtype


# -- full round trips through every writable format ------------------------------------------------

@pytest.mark.parametrize("fmt", ["npy", "raw", "hdf5", "zarr", "mtx", "csv", "tsv"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("order", ["C", "F"])
def test_round_trip_every_format(tmp_path, rng, fmt, dtype, order):
    a = _matrix(rng, (37, 23), dtype)
    src = tmp_path / "a.npy"
    np.save(src, np.asfortranarray(a) if order == "F" else a)
    ext = {"npy": "npy", "raw": "bin", "hdf5": "h5", "zarr": "zarr", "mtx": "mtx", "csv": "csv", "tsv": "tsv"}[fmt]
    out = tmp_path / f"b.{ext}"
    rep = blocklin.convert(src, out, chunks=(5, 7), memory="8MiB", out_order=order)
    assert rep["output"] == str(out) and out.exists()
    back = tmp_path / "c.zarr"
    kw = {"shape": a.shape, "dtype": dtype, "order": order} if fmt == "raw" else {}
    if fmt in ("csv", "tsv") and np.dtype(dtype).kind == "i":
        kw["dtype"] = "int64"  # text does not record the dtype: parse as integers
    blocklin.convert(out, back, chunks=(8, 3), memory="8MiB", **kw)
    got = zarr.open_array(back)[:]
    np.testing.assert_array_equal(got, a)
    if fmt in ("npy", "raw", "hdf5", "zarr"):
        assert got.dtype == np.dtype(dtype)  # binary formats keep the dtype
    else:
        assert got.dtype == np.dtype(TEXT_BACK[np.dtype(dtype).kind])


@pytest.mark.parametrize("order", ["C", "F"])
def test_npy_fortran_read_by_column_panels(tmp_path, rng, order):
    a = rng.standard_normal((50, 40))
    np.save(tmp_path / "a.npy", np.asfortranarray(a) if order == "F" else a)
    rep = blocklin.convert(tmp_path / "a.npy", tmp_path / "a.zarr", chunks=(16, 8), memory="64KiB")
    assert rep["plan"]["order"] == order
    if order == "F":  # whole columns, never a transposed copy of the matrix
        assert rep["plan"]["block"][0] == 50
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "a.zarr")[:], a)


@pytest.mark.parametrize("shape", [(0, 0), (0, 5), (5, 0), (1, 1)])
@pytest.mark.parametrize("fmt", ["npy", "bin", "h5", "zarr", "mtx", "csv"])
def test_edge_shapes(tmp_path, shape, fmt):
    a = np.full(shape, 2.5)
    np.save(tmp_path / "a.npy", a)
    out = tmp_path / f"b.{fmt}"
    blocklin.convert(tmp_path / "a.npy", out)
    kw = {"shape": shape, "dtype": "f8"} if fmt == "bin" else {}
    blocklin.convert(out, tmp_path / "c.zarr", **kw)
    got = zarr.open_array(tmp_path / "c.zarr")[:]
    if fmt == "csv" and a.size == 0:
        assert got.size == 0  # text cannot record the width of an empty matrix
    else:
        np.testing.assert_array_equal(got, a)


# -- readers ---------------------------------------------------------------------------------------

def test_npz_members(tmp_path, rng):
    a, b = rng.standard_normal((20, 10)), rng.integers(0, 9, (4, 3))
    np.savez(tmp_path / "s.npz", a=a, b=b)
    np.savez_compressed(tmp_path / "z.npz", a=np.asfortranarray(a))
    for spec in (f"{tmp_path}/s.npz:a", f"{tmp_path}/z.npz:a", f"{tmp_path}/z.npz"):
        blocklin.convert(spec, tmp_path / "o.zarr", chunks=(3, 4), memory="4MiB", overwrite=True)
        np.testing.assert_array_equal(zarr.open_array(tmp_path / "o.zarr")[:], a)
    with open_reader(f"{tmp_path}/s.npz:b") as r:
        assert r.shape == (4, 3) and r.read(slice(1, 3), slice(0, 2)).tolist() == b[1:3, :2].tolist()
    with pytest.raises(FormatError, match=r"must name its member.*\['a', 'b'\]"):
        open_reader(tmp_path / "s.npz")
    with pytest.raises(FormatError, match="pick one of"):
        open_reader(f"{tmp_path}/s.npz:c")


def test_npy_reads_blocks_without_loading(tmp_path, rng):
    a = rng.standard_normal((30, 20))
    np.save(tmp_path / "c.npy", a)
    np.save(tmp_path / "f.npy", np.asfortranarray(a))
    for name in ("c.npy", "f.npy"):
        with open_reader(tmp_path / name) as r:
            assert r.order == ("F" if name == "f.npy" else "C")
            np.testing.assert_array_equal(r.read(slice(3, 17), slice(5, 11)), a[3:17, 5:11])
            np.testing.assert_array_equal(r.read(slice(0, 30), slice(2, 4)), a[:, 2:4])
            assert r.bytes_read > 0


def test_big_endian_npy_becomes_native(tmp_path, rng):
    a = rng.standard_normal((6, 5)).astype(">f8")
    np.save(tmp_path / "be.npy", a)
    rep = blocklin.convert(tmp_path / "be.npy", tmp_path / "o.npy")
    got = np.load(tmp_path / "o.npy")
    assert got.dtype == np.dtype("<f8") and rep["dtype"] == "float64"
    np.testing.assert_array_equal(got, a)


def _mm(text: str):
    return scipy.io.mmread(io.StringIO(text))


MTX_CASES = {
    "coord-real-general": "%%MatrixMarket matrix coordinate real general\n% c\n3 4 4\n1 1 1.5\n3 4 -2\n2 2 3e2\n1 1 1\n",
    "coord-int-symmetric": "%%MatrixMarket matrix coordinate integer symmetric\n3 3 4\n1 1 4\n2 1 -7\n3 1 5\n3 3 9\n",
    "coord-real-skew": "%%MatrixMarket matrix coordinate real skew-symmetric\n3 3 2\n2 1 0.5\n3 2 -1.25\n",
    "coord-pattern-general": "%%MatrixMarket matrix coordinate pattern general\n2 3 3\n1 1\n2 3\n1 2\n",
    "coord-pattern-symmetric": "%%MatrixMarket matrix coordinate pattern symmetric\n3 3 2\n2 1\n3 3\n",
    "array-real-general": "%%MatrixMarket matrix array real general\n2 3\n1\n2\n3\n4\n5.5\n-6\n",
    "array-int-general": "%%MatrixMarket matrix array integer general\n2 2\n1\n2\n3\n4\n",
    "array-real-symmetric": "%%MatrixMarket matrix array real symmetric\n3 3\n1\n2\n3\n4\n5\n6\n",
    "array-int-skew": "%%MatrixMarket matrix array integer skew-symmetric\n3 3\n2\n3\n5\n",
    "empty-coordinate": "%%MatrixMarket matrix coordinate real general\n2 2 0\n",
}


@pytest.mark.parametrize("case", sorted(MTX_CASES))
def test_matrix_market_matches_scipy(tmp_path, case):
    text = MTX_CASES[case]
    (tmp_path / "m.mtx").write_text(text)
    blocklin.convert(tmp_path / "m.mtx", tmp_path / "m.zarr", chunks=(2, 2), memory="32MiB", layout="dense")
    got = zarr.open_array(tmp_path / "m.zarr")[:]
    want = _mm(text)
    want = want.toarray() if hasattr(want, "toarray") else np.asarray(want)
    np.testing.assert_array_equal(got, want)
    assert got.dtype.kind == want.dtype.kind


def test_matrix_market_written_is_read_by_scipy(tmp_path, rng):
    a = rng.standard_normal((9, 4)).astype(np.float32)
    np.save(tmp_path / "a.npy", a)
    blocklin.convert(tmp_path / "a.npy", tmp_path / "a.mtx", memory="16MiB")
    back = scipy.io.mmread(tmp_path / "a.mtx")
    np.testing.assert_array_equal(back.astype(np.float32), a)
    assert (tmp_path / "a.mtx").read_text().startswith("%%MatrixMarket matrix array real general")


def test_hdf5_dataset_paths(tmp_path, rng):
    h5py = pytest.importorskip("h5py")
    a = rng.standard_normal((12, 7))
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f.create_dataset("/grp/x", data=a, chunks=(4, 7))
        f.create_dataset("/grp/v", data=np.arange(3))
    blocklin.convert(f"{tmp_path}/f.h5:/grp/x", tmp_path / "x.zarr", chunks=(5, 5), memory="16MiB")
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "x.zarr")[:], a)
    blocklin.convert(tmp_path / "f.h5", tmp_path / "y.zarr")  # the only 2-D dataset
    with pytest.raises(FormatError, match="must name a dataset"):
        open_reader(f"{tmp_path}/f.h5:/nope")
    with open_reader(f"{tmp_path}/f.h5:/grp/v") as r:  # 1-D: a column, as a 1-D .npy
        assert r.shape == (3, 1)
    with h5py.File(tmp_path / "f.h5", "a") as f:
        f.create_dataset("/grp/t", data=np.zeros((2, 2, 2)))
    with pytest.raises(FormatError, match="2-D matrix"):
        open_reader(f"{tmp_path}/f.h5:/grp/t")
    blocklin.convert(tmp_path / "x.zarr", f"{tmp_path}/o.h5:/out/m", codec="gzip", chunks=(4, 4))
    with h5py.File(tmp_path / "o.h5") as f:
        np.testing.assert_array_equal(f["/out/m"][:], a)
        assert f["/out/m"].compression == "gzip"


def test_hdf5_one_dimensional_dataset_converts_as_a_column(tmp_path, rng, monkeypatch):
    """A 1-D HDF5 dataset converts as a 1-D .npy does (docs/convert.md): an n x 1 column in zarr, HDF5
    and CSV, 1-D in .npy, the same bits as the .npy's conversion; read by row blocks within the budget."""
    h5py = pytest.importorskip("h5py")
    from blocklin.storage.formats.hdf5 import Hdf5Reader

    v = rng.standard_normal(1 << 21)  # 16 MiB
    with h5py.File(tmp_path / "v.h5", "w") as f:
        f.create_dataset("/g/v", data=v, chunks=(1 << 16,))
    np.save(tmp_path / "v.npy", v)
    real, rows = Hdf5Reader.read, []

    def read(self, r, c):
        block = real(self, r, c)
        rows.append(block.shape[0])
        return block

    monkeypatch.setattr(Hdf5Reader, "read", read)
    memory = 12 << 20  # less than the vector (an HDF5 file open keeps a 4 MiB chunk cache)
    rep = blocklin.convert(f"{tmp_path}/v.h5:/g/v", tmp_path / "h.zarr", memory=memory)
    ref = blocklin.convert(tmp_path / "v.npy", tmp_path / "n.zarr", memory=memory)
    assert rep["planned_memory"] <= memory and len(rows) > 1 and max(rows) * 8 <= memory
    assert zarr.open_array(tmp_path / "h.zarr").shape == zarr.open_array(tmp_path / "n.zarr").shape == (v.size, 1)
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "h.zarr")[:], v[:, None])
    assert rep["chunks"] == ref["chunks"]
    blocklin.convert(f"{tmp_path}/v.h5:/g/v", tmp_path / "v2.npy", memory=memory)
    back = np.load(tmp_path / "v2.npy")
    assert back.shape == v.shape
    np.testing.assert_array_equal(back, v)
    blocklin.convert(f"{tmp_path}/v.h5:/g/v", f"{tmp_path}/o.h5:/c", memory=memory)
    with h5py.File(tmp_path / "o.h5") as f:
        np.testing.assert_array_equal(f["/c"][:], v[:, None])
    blocklin.convert(f"{tmp_path}/v.h5:/g/v", tmp_path / "v.csv", memory=memory)
    np.testing.assert_array_equal(np.loadtxt(tmp_path / "v.csv", delimiter=",", ndmin=1), v)


def test_zarr_v2_input_and_rechunk(tmp_path, rng):
    a = rng.standard_normal((25, 19)).astype(np.float32)
    z = zarr.create_array(tmp_path / "v2.zarr", shape=a.shape, chunks=(7, 5), dtype=a.dtype, zarr_format=2)
    z[:] = a
    rep = blocklin.convert(tmp_path / "v2.zarr", tmp_path / "v3.zarr", chunks=(10, 4), codec="zstd", memory="16MiB")
    out = zarr.open_array(tmp_path / "v3.zarr")
    assert out.metadata.zarr_format == 3 and out.chunks == (10, 4) and rep["codec"] == "zstd"
    np.testing.assert_array_equal(out[:], a)
    blocklin.convert(tmp_path / "v3.zarr", tmp_path / "back.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "back.npy"), a)


def test_csv_header_skip_and_delimiters(tmp_path):
    (tmp_path / "h.csv").write_text("a,b,c\n1,2,3\n# comment\n\n4,5,6\n")
    (tmp_path / "s.txt").write_text("junk line\nmore junk\n1 2\n3   4\n")
    (tmp_path / "semi.csv").write_text("1;2\n3;nan\n")
    with open_reader(tmp_path / "h.csv") as r:
        assert r.shape == (2, 3) and r.header_line == "a,b,c"
        np.testing.assert_array_equal(r.read(slice(0, 2), slice(0, 3)), [[1, 2, 3], [4, 5, 6]])
    with open_reader(tmp_path / "s.txt", skip_rows=2) as r:
        np.testing.assert_array_equal(r.read(slice(0, 2), slice(0, 2)), [[1, 2], [3, 4]])
    with open_reader(tmp_path / "semi.csv", delimiter=";") as r:
        got = r.read(slice(0, 2), slice(0, 2))
        assert got[0].tolist() == [1, 2] and np.isnan(got[1, 1])


def test_format_detection_and_specs(tmp_path):
    assert detect_format("x.NPY") == "npy" and detect_format("a.h5") == "hdf5"
    assert detect_format("a.whatever", "h5") == "hdf5"
    assert split_spec("f.npz:arr") == ("f.npz", "arr")
    assert split_spec("f.h5:/g/d") == ("f.h5", "/g/d")
    with pytest.raises(FormatError, match="known extension"):
        detect_format("data.xyz")
    with pytest.raises(FormatError, match="read only"):
        detect_format("o.npz", output=True)


def test_writer_refuses_non_numeric_and_complex_text(tmp_path):
    with pytest.raises(DTypeError, match="real or integer"):
        open_writer(tmp_path / "c.mtx", (2, 2), np.complex128)
    with pytest.raises(DTypeError, match="numbers"):
        open_writer(tmp_path / "s.npy", (2, 2), "U3")
    assert not [p for p in tmp_path.iterdir() if p.name != "blocklin-tmp"]


@pytest.mark.parametrize("layout", ["array", "coordinate"])
def test_an_integer_beyond_int64_in_an_mtx_file_is_named(tmp_path, layout):
    """A uint64 ``2^64 - 1`` written to ``.mtx`` (its integer field is read as int64) is refused naming the
    line and column on the way back: NumPy's ``OverflowError`` had ended in a traceback."""
    body = "2 1\n18446744073709551615\n1\n" if layout == "array" else "2 1 2\n1 1 1\n2 1 18446744073709551615\n"
    (tmp_path / "u.mtx").write_text(f"%%MatrixMarket matrix {layout} integer general\n{body}")
    line = 3 if layout == "array" else 4  # after the header and the size line
    with pytest.raises(FormatError, match=rf"fields must be integers \(int64\); got '18446744073709551615' at line "
                                          rf"{line}"):
        blocklin.convert(tmp_path / "u.mtx", tmp_path / "u.npy")
