"""``blocklin info`` and blocklin.storage.inspect: facts and estimates for every format."""

from __future__ import annotations

import json

import numcodecs
import numpy as np
import pytest
import zarr
import zarr.codecs

import blocklin
from blocklin.cli.main import main
from blocklin.storage.inspect import inspect


@pytest.fixture
def files(tmp_path, rng):
    a = rng.standard_normal((64, 48))
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "f.npy", np.asfortranarray(a.astype(np.float32)))
    np.savez(tmp_path / "s.npz", x=a)
    blocklin.convert(tmp_path / "a.npy", tmp_path / "a.zarr", chunks=(16, 16), codec="zstd", checksum=True)
    blocklin.convert(tmp_path / "a.npy", tmp_path / "a.csv")
    blocklin.convert(tmp_path / "a.npy", tmp_path / "a.mtx")
    blocklin.convert(tmp_path / "a.npy", tmp_path / "a.h5")
    a.tofile(tmp_path / "a.bin")
    (tmp_path / "c.mtx").write_text("%%MatrixMarket matrix coordinate pattern symmetric\n5 5 3\n2 1\n3 3\n5 4\n")
    z = zarr.create_array(tmp_path / "v2.zarr", shape=(10, 6), chunks=(4, 4), dtype="i4", zarr_format=2)
    z[:] = 7
    return tmp_path, a


def test_info_every_format(files):
    tmp, a = files
    cases = {
        "a.npy": ("npy", "C", "<f8"), "f.npy": ("npy", "F", "<f4"), "s.npz:x": ("npz", "C", "<f8"),
        "a.zarr": ("zarr", "C", "<f8"), "a.csv": ("csv", "C", "<f8"), "a.mtx": ("mtx", "F", "<f8"),
        "a.h5": ("hdf5", "C", "<f8"), "c.mtx": ("mtx", "C", "<f8"), "v2.zarr": ("zarr", "C", "<i4"),
    }
    for name, (fmt, order, dtype) in cases.items():
        d = inspect(f"{tmp}/{name}", memory="64MiB")
        assert (d["format"], d["order"], d["dtype"]) == (fmt, order, dtype), name
        assert d["bytes_on_disk"] > 0 and d["bytes_in_memory"] == np.prod(d["shape"]) * np.dtype(dtype).itemsize
        assert set(d["estimates"]) == {"convert_to_zarr", "pass", "gram"}
        assert all("memory" in e or "error" in e for e in d["estimates"].values())
    raw = inspect(tmp / "a.bin", shape="64,48", dtype="f8")
    assert raw["shape"] == [64, 48] and raw["compression_ratio"] == pytest.approx(1.0)
    assert inspect(tmp / "c.mtx")["nnz"] == 3


def test_info_zarr_details_and_provenance(files):
    tmp, a = files
    d = inspect(tmp / "a.zarr", memory="256MiB")
    assert d["chunks"] == [16, 16] and d["codec"].startswith("zstd") and d["checksum"] is True
    assert d["zarr_format"] == 3
    assert d["provenance"]["operation"] == "convert" and d["provenance"]["inputs"] == [str(tmp / "a.npy")]
    assert d["compression_ratio"] == pytest.approx(a.nbytes / d["bytes_on_disk"])
    g = d["estimates"]["gram"]  # 64 x 48 is tall: the user's product is A^T A (48 x 48), by SYRK
    assert g["product"] == "A^T A" and g["flops"] == 48 * 48 * 64 and g["memory"] <= 256 * 2**20
    assert g["route"] == "pass" and g["bytes_read"] == 64 * 48 * 8 and g["bytes_written"] == 48 * 48 * 8
    v2 = inspect(tmp / "v2.zarr")
    assert v2["zarr_format"] == 2 and v2["provenance"] is None


@pytest.mark.parametrize("layout, facts", [
    ({"zarr_format": 2, "order": "F", "compressors": None}, ("F", "none", "<f8")),
    ({"filters": [zarr.codecs.TransposeCodec(order=(1, 0))], "compressors": zarr.codecs.ZstdCodec()}, ("F", "zstd", "<f8")),
    ({"serializer": zarr.codecs.BytesCodec(endian="big"), "compressors": None}, ("C", "none", ">f8")),
    ({"zarr_format": 2, "filters": [numcodecs.Delta(dtype="f8")], "compressors": numcodecs.Zstd()},
     ("C", "delta+zstd", "<f8")),
    ({"zarr_format": 2, "filters": [numcodecs.AsType(encode_dtype="f4", decode_dtype="f8")], "compressors": None},
     ("C", "astype", "<f8")),
])
def test_info_reports_how_foreign_zarr_chunks_are_stored(tmp_path, rng, layout, facts):
    """Arrays other writers made: the order, filters and byte order of their chunks, not those of what
    reads return (which are C, the values, native): a Fortran-ordered or transposed array had read
    ``order C``, a delta-encoded or float32-stored one ``codec none``, a big-endian v3 one ``<f8``.
    The values read are zarr's either way."""
    a = rng.standard_normal((10, 6))
    z = zarr.create_array(tmp_path / "f.zarr", shape=a.shape, chunks=(4, 4), dtype="f8", **layout)
    z[:] = a
    d = inspect(tmp_path / "f.zarr")
    assert (d["order"], d["codec"], d["dtype"]) == facts
    np.testing.assert_array_equal(blocklin.open(tmp_path / "f.zarr").to_numpy(), z[:])


def test_info_says_where_a_first_pass_takes_its_peaks(files, capsys):
    """A writer's record, an earlier job's scan of the unchanged array, or a scan of every value."""
    tmp, a = files
    assert inspect(tmp / "a.zarr")["peaks"] == {"source": "writer", "amax": float(np.abs(a).max())}
    z = zarr.create_array(tmp / "foreign.zarr", shape=a.shape, chunks=(16, 48), dtype="f8")  # no record
    z[:] = a
    assert inspect(tmp / "foreign.zarr")["peaks"] == {"source": None, "amax": None}
    main(["info", str(tmp / "foreign.zarr")])
    assert "peaks        none kept: a job's first pass scans every value" in capsys.readouterr().out
    blocklin.gram(tmp / "foreign.zarr", memory="64MiB")  # its first pass scans, and keeps what it saw
    assert inspect(tmp / "foreign.zarr")["peaks"] == {"source": "earlier job", "amax": float(np.abs(a).max())}
    main(["info", str(tmp / "foreign.zarr")])
    assert "seen by an earlier job's scan (largest magnitude" in capsys.readouterr().out
    z[0, 0] = 100.0  # changed: its next first pass scans again
    assert inspect(tmp / "foreign.zarr")["peaks"]["source"] is None
    assert "peaks" not in inspect(tmp / "v2.zarr") and "peaks" not in inspect(tmp / "a.npy")  # integers; not zarr


def test_info_estimates_follow_the_budget(files):
    tmp, _ = files
    small = inspect(tmp / "a.npy", memory="64KiB")["estimates"]["convert_to_zarr"]
    big = inspect(tmp / "a.npy", memory="1GiB")["estimates"]["convert_to_zarr"]
    assert "error" in small or small["memory"] <= 64 * 1024
    assert big["memory"] >= small.get("memory", 0)
    tiny = inspect(tmp / "a.npy", memory="4KiB")["estimates"]
    assert "error" in tiny["convert_to_zarr"] and "at least" in tiny["convert_to_zarr"]["error"]


def test_cli_info(files, capsys):
    tmp, _ = files
    assert main(["info", str(tmp / "a.zarr"), "--memory", "512MiB"]) == 0
    out = capsys.readouterr().out
    for word in ("shape", "64 x 48", "float64", "chunks", "16 x 16", "zstd", "on disk", "in memory",
                 "compression", "provenance", "convert of", "estimates with memory=512.00 MiB", "gram", "A^T A (48 x 48"):
        assert word in out, word
    assert main(["info", str(tmp / "a.bin"), "--shape", "64,48", "--dtype", "f8", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["format"] == "raw" and d["shape"] == [64, 48]
    assert main(["info", str(tmp / "missing.npy")]) == 1
    assert "StoreNotFoundError" in capsys.readouterr().err


def test_info_gram_estimate_follows_the_orientation():
    from blocklin.storage.inspect import estimates

    tall = estimates((300000, 2000), "float32", (2048, 2000), 512 * 2**20)["gram"]
    assert tall["product"] == "A^T A" and tall["bytes_written"] == 2000 * 2000 * 4  # not 360 GB of A A^T
    assert tall["route"] == "pass" and tall["bytes_read"] == 300000 * 2000 * 4 and tall["memory"] <= 512 * 2**20
    wide = estimates((2000, 300000), "float32", (2000, 2048), 512 * 2**20)["gram"]
    assert wide["product"] == "A A^T" and wide["bytes_written"] == 2000 * 2000 * 4
