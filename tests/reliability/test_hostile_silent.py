"""Silent acceptance: inputs that used to pass with a wrong or surprising result are refused, each
with the one-line message, exit code 1 and nothing left behind."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

import blocklin
from blocklin.storage.inspect import format_info, inspect
from blocklin.errors import DTypeError, FormatError, ParameterError, StoreReadError, UncommittedOutputError
from support.hostile import assert_refused, leftovers, run_many, write_zarr


@pytest.fixture
def stores(tmp_path):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 64)) + 64 * np.eye(64)
    write_zarr(tmp_path / "a.zarr", a, (32, 32))
    write_zarr(tmp_path / "b.zarr", rng.standard_normal((64, 2)), (32, 2))
    write_zarr(tmp_path / "b32.zarr", rng.standard_normal((64, 2)).astype(np.float32), (32, 2))
    write_zarr(tmp_path / "h.zarr", a.astype(np.float16), (32, 32))
    write_zarr(tmp_path / "miss.zarr", a, (32, 32))
    (tmp_path / "miss.zarr" / "c" / "1" / "1").unlink()
    (tmp_path / "semi.csv").write_text("1;2;3;4\n")
    import shutil

    shutil.copytree(tmp_path / "a.zarr", tmp_path / ".q.zarr.partial-0123abcd")
    return tmp_path


def test_silent_cases_are_refused_on_the_command_line(stores):
    # --alpha nan and --beta inf are usage errors, refused while parsing: tests/reliability/test_cli_arguments.py
    cases = [
        (["convert", "semi.csv", "o1.zarr"], "FormatError", ["--delimiter ';'", "line 1"]),
        (["gemm", ".q.zarr.partial-0123abcd", "a.zarr", "-o", "o4.zarr"], "UncommittedOutputError",
         ["partial folder", "--resume"]),
        (["gemm", "a.zarr", "a.zarr", "-o", "X.npy"], "FormatError", ["X.zarr", "blocklin convert X.zarr X.npy"]),
        (["solve", "h.zarr", "b.zarr", "-o", "o5.zarr"], "DTypeError", ["float16"]),
        (["solve", "a.zarr", "b32.zarr", "-o", "o6.zarr"], "DTypeError", ["a: float64, b: float32", "--dtype float64"]),
        (["gemm", "a.zarr", "a.zarr", "-o", "o7.zarr", "--memory", "1024TiB"], "ConfigError",
         ["must not exceed the memory of this machine", "--memory"]),
        (["gemm", "miss.zarr", "a.zarr", "-o", "o8.zarr", "--require-complete"], "StoreReadError",
         ["3 of 4 chunks", "first missing: c/1/1"]),
    ]
    for (args, error, patterns), proc in zip(cases, run_many([c[0] for c in cases], stores)):
        assert_refused(proc, error, *patterns)
    assert leftovers(stores, stores / "tmp") == [".q.zarr.partial-0123abcd"] or \
        leftovers(stores, stores / "tmp") == [str(stores / ".q.zarr.partial-0123abcd")]
    assert not (stores / "X.npy").exists() and not any((stores / f"o{i}.zarr").exists() for i in range(1, 9))


def test_missing_chunks_reported_by_info_and_refused_on_request(stores):
    d = inspect(str(stores / "miss.zarr"))
    assert d["chunk_files"]["stored"] == 3 and d["chunk_files"]["grid"] == 4
    assert d["chunk_files"]["first_missing"] == "c/1/1"
    assert "1 missing, first c/1/1" in format_info(d)
    # a foreign store with gaps is legitimate zarr (fill value) unless completeness is required
    c = blocklin.matmul(str(stores / "miss.zarr"), np.eye(64), stores / "c.zarr")
    expected = zarr.open_array(str(stores / "miss.zarr"))[...]
    np.testing.assert_array_equal(c.to_numpy(), expected)
    with pytest.raises(StoreReadError, match="first missing: c/1/1"):
        blocklin.matmul(str(stores / "miss.zarr"), np.eye(64), stores / "d.zarr", require_complete=True)
    assert not (stores / "d.zarr").exists()


def test_a_blocklin_output_that_lost_chunk_files_is_refused_by_default(stores):
    c = blocklin.matmul(str(stores / "a.zarr"), str(stores / "a.zarr"), stores / "c.zarr", memory="64KiB")
    recorded = c.provenance["stored_chunks"]
    assert recorded == len(list((stores / "c.zarr" / "c").rglob("*"))) - len(list((stores / "c.zarr" / "c").glob("*")))
    victim = sorted(p for p in (stores / "c.zarr" / "c").rglob("*") if p.is_file())[-1]
    victim.unlink()
    with pytest.raises(StoreReadError, match=f"{recorded - 1} of {recorded} chunk files"):
        blocklin.svd(str(stores / "c.zarr"), 2, out=stores / "u")
    with pytest.raises(StoreReadError, match="blocklin committed it with"):
        blocklin.convert(str(stores / "c.zarr"), str(stores / "c.npy"))
    assert "DAMAGED" in format_info(inspect(str(stores / "c.zarr")))
    assert leftovers(stores) == [str(stores / ".q.zarr.partial-0123abcd")]


def test_python_api_refusals(stores):
    tmp_path = stores / "api"
    tmp_path.mkdir()
    with pytest.raises(ParameterError, match="alpha: must be a finite number"):
        blocklin.matmul(np.eye(3), np.eye(3), tmp_path / "x.zarr", alpha=float("nan"))
    with pytest.raises(DTypeError, match="a: float64, b: float32"):
        blocklin.solve(str(stores / "a.zarr"), str(stores / "b32.zarr"), assume_a="pos", out=tmp_path / "y.zarr")
    with pytest.raises(UncommittedOutputError, match="partial folder"):
        blocklin.open(str(stores / ".q.zarr.partial-0123abcd"))
    with pytest.raises(FormatError, match="operations write zarr stores"):
        blocklin.inv(str(stores / "a.zarr"), out=tmp_path / "inv.csv")
    (tmp_path / "tabs.csv").write_text("1\t2\n3\t4\n")
    with pytest.raises(FormatError, match="'tab' splits it into 2 numbers"):
        blocklin.convert(str(tmp_path / "tabs.csv"), str(tmp_path / "t.zarr"))
    # a real header and a one-column file still convert
    (tmp_path / "h.csv").write_text("x,y\n1,2\n3,4\n")
    assert blocklin.convert(str(tmp_path / "h.csv"), str(tmp_path / "h.zarr"))["shape"] == [2, 2]
    (tmp_path / "one.csv").write_text("x\n1\n2\n")
    assert blocklin.convert(str(tmp_path / "one.csv"), str(tmp_path / "one.zarr"))["shape"] == [2, 1]
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(("layout", "size", "body"), [
    ("array", "0 0", "1.5\n"),                  # an empty matrix followed by a value
    ("array", "1 1", "1.5\n2.5\n"),             # one value more than 1 x 1
    ("coordinate", "5 5 0", "1 1 1.5\n"),       # no entries announced, one given
])
def test_matrix_market_data_beyond_the_size_line_is_refused(tmp_path, layout, size, body):
    """Entries after those the size line announces mean a wrong size line: refused, not dropped."""
    path = tmp_path / "f.mtx"
    path.write_text(f"%%MatrixMarket matrix {layout} real general\n{size}\n{body}")
    with pytest.raises(FormatError, match="must end after the entries the header announces"):
        blocklin.convert(str(path), str(tmp_path / "o.zarr"))
    assert not (tmp_path / "o.zarr").exists()


def test_npy_data_beyond_its_header_is_refused(tmp_path):
    """A .npy header whose shape covers less than the data that follows is damaged: refused."""
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f8", "fortran_order": False, "shape": (2, 1)})
    (tmp_path / "f.npy").write_bytes(buf.getvalue() + np.arange(3.0).tobytes())
    with pytest.raises(FormatError, match="must hold exactly the bytes its header announces"):
        blocklin.convert(str(tmp_path / "f.npy"), str(tmp_path / "o.zarr"))
    assert not (tmp_path / "o.zarr").exists()
