"""Hostile data: corrupt chunks and damaged metadata end in one StoreReadError naming the array, the
chunk and the fix, in every command and reader; never a traceback, never a silent answer."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import blocklin
from blocklin.errors import BlocklinError, ParameterError, StoreReadError
from blocklin.storage.inspect import inspect
from support.hostile import assert_refused, edit_metadata, leftovers, run_many, write_zarr


def _spd(n: int = 64) -> np.ndarray:
    a = np.random.default_rng(0).standard_normal((n, n))
    return a @ a.T + n * np.eye(n)


def _damage(path, key: str = "c/0/0", at: int = 10) -> None:
    chunk = path / key
    data = bytearray(chunk.read_bytes())
    data[at:at + 20] = b"\xff" * 20
    chunk.write_bytes(bytes(data))


@pytest.fixture
def corrupt(tmp_path):
    write_zarr(tmp_path / "zstd.zarr", _spd(), (32, 32), compressors=zarr.codecs.ZstdCodec())
    _damage(tmp_path / "zstd.zarr")
    z = zarr.create_array(str(tmp_path / "crc.zarr"), shape=(64, 64), chunks=(32, 32), dtype="float64",
                          compressors=[zarr.codecs.Crc32cCodec()])
    z[:] = _spd()
    chunk = tmp_path / "crc.zarr" / "c" / "1" / "0"
    data = bytearray(chunk.read_bytes())
    data[100] ^= 0xFF
    chunk.write_bytes(bytes(data))
    write_zarr(tmp_path / "b.zarr", np.ones((64, 2)), (32, 2))
    write_zarr(tmp_path / "ok.zarr", _spd(), (32, 32))
    return tmp_path


def test_a_corrupt_zstd_chunk_is_one_line_in_every_command(corrupt):
    cases = [["gemm", "zstd.zarr", "ok.zarr", "-o", "o1.zarr"], ["svd", "zstd.zarr", "-k", "2", "-o", "o2"],
             ["inv", "zstd.zarr", "-o", "o3.zarr"], ["solve", "zstd.zarr", "b.zarr", "-o", "o4.zarr"],
             ["convert", "zstd.zarr", "o5.npy"], ["factor", "lu", "zstd.zarr", "-o", "o6.zarr"],
             ["pca", "zstd.zarr", "-k", "2"]]
    for proc in run_many(cases, corrupt):
        line = assert_refused(proc, "StoreReadError", "every chunk must decode with the array's codecs",
                              f"chunk c/0/0 of {corrupt / 'zstd.zarr'}", "Zstd", "re-create it")
        assert "Traceback" not in proc.stderr, line
    assert leftovers(corrupt, corrupt / "tmp") == []


def test_a_checksum_mismatch_names_the_chunk(corrupt):
    cases = [["inv", "crc.zarr", "-o", "o1.zarr"], ["factor", "cholesky", "crc.zarr", "-o", "o2.zarr"]]
    for proc in run_many(cases, corrupt):
        assert_refused(proc, "StoreReadError", "crc32c checksum", f"chunk c/1/0 of {corrupt / 'crc.zarr'}")
    assert leftovers(corrupt, corrupt / "tmp") == []


def test_python_reads_raise_store_read_error(corrupt):
    m = blocklin.open(str(corrupt / "zstd.zarr"))
    with pytest.raises(StoreReadError, match="chunk c/0/0"):
        m.to_numpy()
    with pytest.raises(StoreReadError, match="chunk c/0/0"):
        m[0:3, 0:3]
    with pytest.raises(StoreReadError, match="crc32c.*chunk c/1/0"):
        blocklin.matmul(str(corrupt / "crc.zarr"), str(corrupt / "ok.zarr"), corrupt / "c.zarr")
    assert not (corrupt / "c.zarr").exists()


def test_a_truncated_uncompressed_chunk_is_refused(tmp_path):
    write_zarr(tmp_path / "a.zarr", _spd(), (32, 32))
    chunk = tmp_path / "a.zarr" / "c" / "0" / "1"
    chunk.write_bytes(chunk.read_bytes()[:100])
    with pytest.raises(StoreReadError, match="truncated or corrupt"):
        blocklin.inv(str(tmp_path / "a.zarr"), out=tmp_path / "x.zarr")
    assert leftovers(tmp_path) == []


def test_a_zero_chunk_dimension_is_a_clear_error(tmp_path):
    write_zarr(tmp_path / "z.zarr", _spd(), (32, 32))
    meta = json.loads((tmp_path / "z.zarr" / "zarr.json").read_text())
    meta["chunk_grid"]["configuration"]["chunk_shape"] = [0, 32]
    edit_metadata(tmp_path / "z.zarr", chunk_grid=meta["chunk_grid"])
    write_zarr(tmp_path / "ok.zarr", _spd(), (32, 32))
    for proc in run_many([["gemm", "z.zarr", "ok.zarr", "-o", "c.zarr"], ["info", "z.zarr"]], tmp_path):
        assert_refused(proc, "StoreReadError", "positive chunk dimensions", "chunks (0, 32)", "zarr.json")
    assert leftovers(tmp_path, tmp_path / "tmp") == []


def test_an_overflowing_lambda_is_refused_before_any_work(tmp_path):
    with pytest.raises(ParameterError, match=r"lam: must be <= 1e\+150.*got 1e\+300"):
        blocklin.solve(np.eye(4), np.ones((4, 1)), lam=1e300, out=tmp_path / "x.zarr")
    with pytest.raises(ParameterError, match="lam: must be <= "):
        blocklin.solve(np.eye(4), np.ones((4, 1)), lam=[1e-3, 1e200], out=tmp_path / "x.zarr")
    x = blocklin.solve(np.eye(4), np.ones((4, 1)), lam=1e150, out=tmp_path / "y.zarr")  # the edge still works
    assert np.all(np.isfinite(x.to_numpy()))
    assert leftovers(tmp_path) == []


# -- a fuzzer of zarr metadata: every damage is a BlocklinError (or the array still reads right) --------

_FIELDS = {
    "shape": st.lists(st.one_of(st.integers(-3, 10**13), st.just("x")), min_size=0, max_size=3),
    "chunk_grid": st.fixed_dictionaries({"name": st.sampled_from(["regular", "rectilinear"]),
                                         "configuration": st.fixed_dictionaries({"chunk_shape": st.lists(
                                             st.integers(-2, 10**9), min_size=1, max_size=3)})}),
    "data_type": st.sampled_from(["float64", "float16", "int8", "bool", "complex128", "nonsense"]),
    "fill_value": st.one_of(st.just("NaN"), st.integers(), st.text(max_size=4), st.none()),
    "codecs": st.sampled_from([[], [{"name": "bytes", "configuration": {"endian": "big"}}],
                               [{"name": "zstd", "configuration": {"level": 1}}],
                               [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]]),
}


@settings(derandomize=True, max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(field=st.sampled_from(sorted(_FIELDS)), data=st.data())
def test_fuzzed_metadata_never_escapes_as_another_exception(tmp_path_factory, field, data):
    folder = tmp_path_factory.mktemp("fuzz")
    a = np.arange(48.0).reshape(8, 6)
    write_zarr(folder / "a.zarr", a, (4, 3))
    edit_metadata(folder / "a.zarr", **{field: data.draw(_FIELDS[field])})
    try:
        m = blocklin.open(str(folder / "a.zarr"))
        # loading a declared 10^13 rows must be refused; smaller declared shapes are read in part
        got = m.to_numpy() if m.shape[0] * m.shape[1] <= 10**4 or m.shape[0] > 10**12 else m[0:8, 0:6]
        inspect(str(folder / "a.zarr"))
        blocklin.convert(str(folder / "a.zarr"), str(folder / "b.npy"))
    except BlocklinError:
        return
    except MemoryError as exc:  # pragma: no cover - would be the bug this test looks for
        pytest.fail(f"MemoryError escaped for {field}: {exc!r}")
    # metadata that changed nothing a reader uses reads the values the chunk files hold (a metadata
    # lie about the layout, a big-endian codec say, cannot be detected and is not asserted on)
    if field == "fill_value" and got.shape == a.shape and got.dtype == a.dtype:
        np.testing.assert_array_equal(got, a)


@settings(derandomize=True, max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(at=st.integers(0, 60), garbage=st.binary(min_size=1, max_size=40))
def test_fuzzed_chunk_bytes_under_a_checksum_are_store_read_errors(tmp_path_factory, at, garbage):
    # zstd alone may decode damaged bytes into other values without a word (found by this fuzzer);
    # with --checksum (crc32c) every change to a chunk file must be refused, naming the chunk
    folder = tmp_path_factory.mktemp("zfuzz")
    a = np.arange(64.0).reshape(8, 8)
    write_zarr(folder / "a.zarr", a, (4, 4), compressors=[zarr.codecs.ZstdCodec(), zarr.codecs.Crc32cCodec()])
    chunk = folder / "a.zarr" / "c" / "1" / "0"
    before = chunk.read_bytes()
    data = bytearray(before)
    data[at:at + len(garbage)] = garbage
    chunk.write_bytes(bytes(data))
    if bytes(data) == before:
        np.testing.assert_array_equal(blocklin.open(str(folder / "a.zarr")).to_numpy(), a)
        return
    with pytest.raises(StoreReadError, match="chunk c/1/0"):
        blocklin.open(str(folder / "a.zarr")).to_numpy()
