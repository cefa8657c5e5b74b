"""blocklin.convert / ``blocklin convert``: chunks, dtypes, safety, resume after a kill, bad inputs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import zarr

import blocklin
from blocklin.storage.records import PEAKS_RECORD
from blocklin.cli.main import main
from blocklin.errors import (
    BudgetError, ConfigError, DTypeError, FormatError, NonFiniteError, OutputExistsError, OutputIsInputError,
    StoreReadError,
)
from blocklin.progress import ProgressRecorder


def _leftovers(folder, keep=("a.npy", "blocklin-tmp")):
    return sorted(p.name for p in folder.iterdir() if p.name not in keep)


# -- chunks, dtypes, progress, report --------------------------------------------------------------

def test_explicit_and_auto_chunks(tmp_path, npy, a):
    blocklin.convert(npy, tmp_path / "e.zarr", chunks=(17, 13), memory="1MiB")
    z = zarr.open_array(tmp_path / "e.zarr")
    assert z.chunks == (17, 13)
    np.testing.assert_array_equal(z[:], a)
    rep = blocklin.convert(npy, tmp_path / "auto.zarr", memory="64MiB")
    from blocklin.plan.chunks import auto_chunks

    assert tuple(rep["chunks"]) == auto_chunks(a.shape, a.dtype, 64 * 2**20)


def test_report_and_provenance(tmp_path, npy, a):
    rec = ProgressRecorder()
    rep = blocklin.convert(npy, tmp_path / "o.zarr", chunks=(16, 90), memory="48KiB", progress=rec)
    for key in ("seconds", "bytes_read", "bytes_written", "peak_memory", "output", "planned_memory", "blocks"):
        assert key in rep
    assert rep["bytes_read"] == a.nbytes and rep["bytes_written"] > a.nbytes * 0.9
    assert rep["planned_memory"] <= 48 * 1024
    assert rec.total == rep["blocks"] == rec.done > 1
    prov = zarr.open_array(tmp_path / "o.zarr").attrs["blocklin"]
    assert prov["operation"] == "convert" and prov["inputs"] == [str(npy)] and prov["params"]["chunks"] == [16, 90]


def test_dtype_rules(tmp_path, npy, a):
    rep = blocklin.convert(npy, tmp_path / "f32.zarr", dtype="float32")
    z = zarr.open_array(tmp_path / "f32.zarr")
    assert z.dtype == np.float32 and rep["dtype"] == "float32"
    np.testing.assert_array_equal(z[:], a.astype(np.float32))
    with pytest.raises(DTypeError, match=r"float64 to int64 would lose values.*Fix: keep float64"):
        blocklin.convert(npy, tmp_path / "i.zarr", dtype="int64")
    ints = np.arange(12, dtype=np.int64).reshape(3, 4) * 50
    np.save(tmp_path / "i.npy", ints)
    blocklin.convert(tmp_path / "i.npy", tmp_path / "i.zarr", dtype="float64")
    with pytest.raises(DTypeError, match=r"values must fit int8.*150 at row 1, column 4"):
        blocklin.convert(tmp_path / "i.npy", tmp_path / "i8.zarr", dtype="int8")
    assert not (tmp_path / "i8.zarr").exists() and not (tmp_path / "f.zarr").exists()
    if np.dtype(np.longdouble).itemsize > 8:  # extended precision: zarr stores none (its own error named nothing)
        with pytest.raises(DTypeError, match=r"dtype: must be a dtype zarr stores.*got float128.*convert to \.npy"):
            blocklin.convert(npy, tmp_path / "x.zarr", dtype="longdouble")
        assert not (tmp_path / "x.zarr").exists() and not list(tmp_path.glob(".x.zarr.partial-*"))
        blocklin.convert(npy, tmp_path / "x.npy", dtype="longdouble")  # the fix it names
        np.testing.assert_array_equal(np.load(tmp_path / "x.npy"), a.astype(np.longdouble))


def test_nan_policy(tmp_path):
    (tmp_path / "n.csv").write_text("1,2\nnan,4\n")
    blocklin.convert(tmp_path / "n.csv", tmp_path / "ok.zarr")  # default: copied
    assert np.isnan(zarr.open_array(tmp_path / "ok.zarr")[1, 0])
    with pytest.raises(NonFiniteError, match="NaN at line 2, column 1"):
        blocklin.convert(tmp_path / "n.csv", tmp_path / "bad.zarr", nan="error")
    assert not (tmp_path / "bad.zarr").exists()


def test_codecs_and_checksum_verified_on_read(tmp_path, npy, a):
    blocklin.convert(npy, tmp_path / "c.zarr", chunks=(40, 30), codec="blosc-lz4", checksum=True)
    z = zarr.open_array(tmp_path / "c.zarr")
    np.testing.assert_array_equal(z[:], a)
    chunk = tmp_path / "c.zarr" / "c" / "1" / "1"
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(StoreReadError, match=r"crc32c checksum.*chunk c/1/1 of .*c.zarr.*re-create it"):
        blocklin.convert(tmp_path / "c.zarr", tmp_path / "d.npy")
    assert not (tmp_path / "d.npy").exists()
    with pytest.raises(ConfigError, match="checksums are stored in zarr chunks only"):
        blocklin.convert(npy, tmp_path / "x.npy", checksum=True)


def test_text_source_to_column_writer_is_staged(tmp_path, a):
    np.savetxt(tmp_path / "a.csv", a, delimiter=",", fmt="%.17g")
    rep = blocklin.convert(tmp_path / "a.csv", tmp_path / "a.mtx", memory="16MiB")
    import scipy.io

    assert rep["staged"]
    np.testing.assert_array_equal(scipy.io.mmread(tmp_path / "a.mtx"), a)
    assert not list((tmp_path / "blocklin-tmp").iterdir())  # the stage is removed


# -- outputs are safe ------------------------------------------------------------------------------

def test_existing_output_and_output_is_input(tmp_path, npy, a):
    (tmp_path / "o.npy").write_bytes(b"precious")
    with pytest.raises(OutputExistsError, match="--overwrite"):
        blocklin.convert(npy, tmp_path / "o.npy")
    # overwrite replaces a .npy file only: this one is not (tests/storage/test_output_safety.py has the rest)
    with pytest.raises(OutputExistsError, match="not a .npy file"):
        blocklin.convert(npy, tmp_path / "o.npy", overwrite=True)
    assert (tmp_path / "o.npy").read_bytes() == b"precious"
    # nor a .npy another program wrote: only blocklin's own export (its record .o.npy.blocklin matches)
    np.save(tmp_path / "o.npy", np.zeros((2, 2)))
    with pytest.raises(OutputExistsError, match="a .npy file blocklin did not write"):
        blocklin.convert(npy, tmp_path / "o.npy", overwrite=True)
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), np.zeros((2, 2)))
    (tmp_path / "o.npy").unlink()
    blocklin.convert(npy, tmp_path / "o.npy")
    blocklin.convert(npy, tmp_path / "o.npy", overwrite=True)
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), a)
    with pytest.raises(OutputIsInputError):
        blocklin.convert(npy, npy, overwrite=True)
    blocklin.convert(npy, tmp_path / "z.zarr")
    with pytest.raises(OutputExistsError):
        blocklin.convert(npy, tmp_path / "z.zarr")
    blocklin.convert(npy, tmp_path / "z.zarr", overwrite=True, dtype="float32")
    assert zarr.open_array(tmp_path / "z.zarr").dtype == np.float32


_KILL = textwrap.dedent("""
    import os, signal, sys
    import blocklin

    class KillAfter:
        def __init__(self, n): self.n, self.k = n, 0
        def start(self, total, desc): pass
        def advance(self, n=1):
            self.k += n
            if self.k >= self.n:
                os.kill(os.getpid(), signal.SIGKILL)
        def close(self): pass

    src, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    blocklin.convert(src, out, chunks=(16, 45), memory="48KiB", progress=KillAfter(n))
""")


def _kill_run(tmp_path, src, out, n):
    script = tmp_path / "kill.py"
    script.write_text(_KILL)
    proc = subprocess.run([sys.executable, str(script), str(src), str(out), str(n)], capture_output=True)
    assert proc.returncode == -9, proc.stderr.decode()


def _chunk_files(store):
    return {os.path.relpath(os.path.join(r, f), store): os.stat(os.path.join(r, f)).st_mtime_ns
            for r, _, fs in os.walk(store) for f in fs if "/c/" in os.path.join(r, f) or r.endswith("/c")}


def test_killed_conversion_resumes_identically(tmp_path, npy, a):
    out = tmp_path / "o.zarr"
    _kill_run(tmp_path, npy, out, 3)
    assert not out.exists()  # nothing finished-looking
    partials = [p for p in tmp_path.iterdir() if p.name.startswith(".o.zarr.partial-")]
    assert len(partials) == 1
    before = _chunk_files(partials[0])
    rep = blocklin.convert(npy, out, chunks=(16, 45), memory="48KiB", resume=True)
    assert rep["blocks_skipped"] == 3 and rep["resumed"] and rep["blocks"] > 3
    # the blocks copied before the kill were not seen by this run: no record of the peaks
    assert rep["peaks_recorded"] is False and not (out / PEAKS_RECORD).exists()
    after = _chunk_files(out)
    done_rows = {str(i) for i in range(3)}  # blocks are 16-row panels: chunk rows 0..2 were done
    kept = [n for n in before if n.split(os.sep)[1] in done_rows]
    assert kept and all(after[n] == before[n] for n in kept)  # finished chunks were not rewritten
    assert blocklin.convert(npy, tmp_path / "fresh.zarr", chunks=(16, 45), memory="48KiB")["peaks_recorded"]
    np.testing.assert_array_equal(zarr.open_array(out)[:], a)
    fresh = _chunk_files(tmp_path / "fresh.zarr")
    assert set(fresh) == set(after)
    for name in fresh:
        assert (tmp_path / "fresh.zarr" / name).read_bytes() == (out / name).read_bytes()
    assert "blocklin-done" not in " ".join(os.listdir(out))


def test_killed_file_output_leaves_only_a_hidden_partial(tmp_path, npy, a):
    out = tmp_path / "o.npy"
    _kill_run(tmp_path, npy, out, 2)
    assert not out.exists()
    assert all(n.startswith(".o.npy.partial-") for n in _leftovers(tmp_path, ("a.npy", "blocklin-tmp", "kill.py")))
    blocklin.convert(npy, out, chunks=(16, 45), memory="48KiB", resume=True)  # file outputs restart
    np.testing.assert_array_equal(np.load(out), a)
    assert _leftovers(tmp_path, ("a.npy", "blocklin-tmp", "kill.py", "o.npy", ".o.npy.blocklin")) == []


def test_failed_conversion_leaves_nothing(tmp_path):
    (tmp_path / "bad.csv").write_text("1,2\n" * 5000 + "1,x\n")
    for out in ("o.zarr", "o.npy", "o.mtx", "o.csv"):
        with pytest.raises(FormatError, match="line 5001, column 2"):
            blocklin.convert(tmp_path / "bad.csv", tmp_path / out, memory="16MiB", chunks=(64, 2))
    assert _leftovers(tmp_path, ("bad.csv", "blocklin-tmp")) == []


# -- every malformed input has a clear message -----------------------------------------------------

def _write(tmp_path, name, content):
    p = tmp_path / name
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    return p


BAD_INPUTS = [
    ("not-npy.npy", b"hello, world\n", {}, FormatError, r"valid \.npy header"),
    ("m1.mtx", "%%NotMatrixMarket\n1 1\n", {}, FormatError, "line 1 must be the banner"),
    ("m2.mtx", "%%MatrixMarket matrix coordinate real general\n2 2\n", {}, FormatError,
     "size line must hold 3 non-negative integers"),
    ("m3.mtx", "%%MatrixMarket matrix coordinate real general\n2 2 3\n1 1 1\n2 2 2\n", {}, FormatError,
     r"3 entries.*end of file.*truncated"),
    ("m4.mtx", "%%MatrixMarket matrix coordinate real general\n2 2 2\n1 1 1\n5 1 2\n", {}, FormatError,
     r"1\.\.2 \(rows\).*\(5, 1\) at line 4"),
    ("m5.mtx", "%%MatrixMarket matrix array real general\n2 2\n1\n2\n3\n", {}, FormatError, "truncated"),
    ("m6.mtx", "%%MatrixMarket matrix array real general\n2 1\n1\nabc\n", {}, FormatError,
     "'abc' at line 4, column 1"),
    ("m7.mtx", "%%MatrixMarket matrix coordinate real general\n2 2 1\n1 1 1\n2 2 2\n", {}, FormatError,
     "extra data at line 4"),
    ("m8.mtx", "%%MatrixMarket matrix coordinate complex general\n1 1 1\n1 1 1 0\n", {}, DTypeError, "complex"),
    ("m9.mtx", "%%MatrixMarket matrix coordinate real symmetric\n2 3 1\n1 1 1\n", {}, FormatError, "square"),
    ("c1.csv", "1,2,3\n4,abc,6\n", {}, FormatError, r"'abc' at line 2, column 2"),
    ("c2.csv", "# comment\n1,2,3\n4,5\n", {}, FormatError, r"3 fields.*2 fields at line 3"),
    ("c3.csv", "1,2\n3,\n", {}, FormatError, r"'' at line 2, column 2"),
    ("c4.csv", "1,2\n3,4.5\n", {"dtype": "int64"}, FormatError, r"integers \(int64\).*'4.5' at line 2, column 2"),
    ("r1.bin", b"\0" * 100, {"shape": (3, 4), "dtype": "f8"}, FormatError,
     r"file size must equal.*100 bytes.*expects 96"),
    ("r2.bin", b"\0" * 96, {}, ConfigError, "needs its shape and dtype"),
    ("r3.bin", b"\0" * 96, {"shape": "3", "dtype": "f8"}, ConfigError, "two non-negative integers"),
]


@pytest.mark.parametrize("name,content,kw,exc,msg", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_malformed_input_messages(tmp_path, name, content, kw, exc, msg):
    src = _write(tmp_path, name, content)
    with pytest.raises(exc, match=msg) as info:
        blocklin.convert(src, tmp_path / "out.zarr", memory="64MiB", **kw)
    assert "Fix:" in str(info.value)
    assert not (tmp_path / "out.zarr").exists()
    assert _leftovers(tmp_path, (name, "blocklin-tmp")) == []


def test_truncated_npy(tmp_path, a):
    np.save(tmp_path / "t.npy", a)
    data = (tmp_path / "t.npy").read_bytes()
    (tmp_path / "t.npy").write_bytes(data[: len(data) - 100])
    with pytest.raises(FormatError, match=r"header says shape \(120, 90\).*truncated"):
        blocklin.convert(tmp_path / "t.npy", tmp_path / "o.zarr")


def test_mislabeled_file_and_explicit_format(tmp_path):
    src = _write(tmp_path, "table.npy", "1,2\n3,4\n")
    with pytest.raises(FormatError, match=r"\.npy header.*pass --from"):
        blocklin.convert(src, tmp_path / "o.zarr")
    blocklin.convert(src, tmp_path / "o.zarr", from_format="csv")
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "o.zarr")[:], [[1, 2], [3, 4]])
    with pytest.raises(FormatError, match="known extension"):
        blocklin.convert(src, tmp_path / "o.weird")
    blocklin.convert(src, tmp_path / "o.weird", from_format="csv", to_format="npy")
    assert np.load(tmp_path / "o.weird").shape == (2, 2)


def test_coordinate_reader_states_its_memory(tmp_path):
    n = 300_000
    rows = np.arange(n) % 1000 + 1
    body = "".join(f"{r} {c} 1.0\n" for r, c in zip(rows, np.arange(n) % 1000 + 1))
    src = _write(tmp_path, "big.mtx", f"%%MatrixMarket matrix coordinate real symmetric\n1000 1000 {n}\n" + body)
    with pytest.raises(BudgetError, match=r"holds its 300000 entries \(mirrored\) as triplets \((\d+)MiB\).*"
                                          r"at least (\d+)MiB") as info:
        blocklin.convert(src, tmp_path / "o.zarr", memory="16MiB", layout="dense")
    assert not (tmp_path / "o.zarr").exists()
    need = str(info.value).split("at least ")[1].split(" ")[0]
    blocklin.convert(src, tmp_path / "o.zarr", memory=need, layout="dense")


def _symmetric_array_file(path, a, symmetry, field="real"):
    """``a``'s lower triangle column by column (below the diagonal when skew-symmetric), as the
    Matrix Market ``array`` format stores a symmetric matrix."""
    n = a.shape[0]
    fmt = repr if field == "real" else str
    with open(path, "w") as f:
        f.write(f"%%MatrixMarket matrix array {field} {symmetry}\n% test\n{n} {n}\n")
        for j in range(n):
            col = a[j + (symmetry == "skew-symmetric"):, j].tolist()
            f.write("".join(fmt(v) + "\n" for v in col))
    return path


@pytest.mark.parametrize("symmetry,field", [("symmetric", "real"), ("skew-symmetric", "real"),
                                            ("symmetric", "integer")])
def test_symmetric_array_mtx_is_mirrored_in_strips(tmp_path, rng, symmetry, field):
    """A symmetric (or skew) dense file is mirrored into a scratch zarr strip by strip (several strips
    at this budget, the last one narrower), within the budget, to the values scipy reads, bit for bit;
    the scratch goes with the conversion, and every export of it holds the same values."""
    import scipy.io

    from blocklin.plan.convert import plan_mirror

    n = 300
    g = rng.standard_normal((n, n)) if field == "real" else rng.integers(-50, 50, (n, n))
    a = np.tril(g, -1) + (np.tril(g, -1).T if symmetry == "symmetric" else -np.tril(g, -1).T)
    if symmetry == "symmetric":
        a += np.diag(np.diag(g))
    src = _symmetric_array_file(tmp_path / "s.mtx", a, symmetry, field)
    want = np.asarray(scipy.io.mmread(src))
    np.testing.assert_array_equal(want, a)  # the file is what scipy reads
    temp = tmp_path / "temp"
    temp.mkdir()
    memory = 4 * 2**20 + 600_000  # the parse batch and strips of about 100 columns
    width = plan_mirror(n, a.dtype, memory=memory, parse_bytes=4 << 20).width
    assert 64 <= width < n and n % width  # several strips, a narrower last one
    with blocklin.config.set(temp_dir=str(temp)):
        rep = blocklin.convert(src, tmp_path / "s.zarr", memory=memory)
        for out in ("s.npy", "s.csv", "s2.mtx"):
            blocklin.convert(src, tmp_path / out, memory=memory)
    got = zarr.open_array(tmp_path / "s.zarr")[:]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.load(tmp_path / "s.npy"), want)
    np.testing.assert_array_equal(np.loadtxt(tmp_path / "s.csv", delimiter=",", dtype=want.dtype), want)
    np.testing.assert_array_equal(np.asarray(scipy.io.mmread(tmp_path / "s2.mtx")), want)
    plan = rep["plan"]
    assert 0 < plan["prepare_bytes"] <= plan["peak_memory"] <= memory
    assert plan["fixed_bytes"] + plan["block_bytes"] <= plan["peak_memory"]
    assert list(temp.iterdir()) == []  # the scratch went with the conversion


def test_symmetric_array_mtx_budget_and_truncation(tmp_path, rng):
    """Below one strip of the narrowest width the conversion is refused naming a budget that works;
    a truncated file is refused after the strips read so far, and its scratch is removed too."""
    n = 200
    g = rng.standard_normal((n, n))
    src = _symmetric_array_file(tmp_path / "s.mtx", np.tril(g) + np.tril(g, -1).T, "symmetric")
    temp = tmp_path / "temp"
    temp.mkdir()
    with blocklin.config.set(temp_dir=str(temp)):
        with pytest.raises(BudgetError, match=r"one strip of 64 columns.*mirrored.*at least (\S+)") as info:
            blocklin.convert(src, tmp_path / "o.zarr", memory="4MiB")
        blocklin.convert(src, tmp_path / "o.zarr", memory=info.value.minimum)
        lines = src.read_text().splitlines(keepends=True)
        cut = _write(tmp_path, "cut.mtx", "".join(lines[:len(lines) - 500]))
        with pytest.raises(FormatError, match="truncated"):
            blocklin.convert(cut, tmp_path / "c.zarr", memory="8MiB")
    assert not (tmp_path / "c.zarr").exists() and list(temp.iterdir()) == []
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "o.zarr")[:], np.tril(g) + np.tril(g, -1).T)


def test_one_dimensional_results_export(tmp_path, rng, capsys):
    """1-D members of result groups (an SVD's S, a centered one's mean) export from the CLI: .npy
    keeps them 1-D, CSV/text write one value a line and Matrix Market an n x 1 array, each holding
    the stored values bit for bit; a zarr copy is an n x 1 column."""
    import scipy.io

    x = rng.standard_normal((200, 30)) + 3.0
    blocklin.svd(x, 4, out=str(tmp_path / "svd.zarr"), center=True, memory="16MiB")
    for name in ("S", "mean"):
        stored = zarr.open_array(tmp_path / "svd.zarr" / name)[:]
        assert stored.ndim == 1
        member = str(tmp_path / "svd.zarr" / name)
        for ext in ("npy", "csv", "txt", "mtx", "zarr"):
            assert main(["convert", member, str(tmp_path / f"{name}.{ext}")]) == 0, capsys.readouterr().err
        got = np.load(tmp_path / f"{name}.npy")
        assert got.shape == stored.shape and got.dtype == stored.dtype
        np.testing.assert_array_equal(got, stored)
        np.testing.assert_array_equal(np.loadtxt(tmp_path / f"{name}.csv", delimiter=",", ndmin=1), stored)
        np.testing.assert_array_equal(np.loadtxt(tmp_path / f"{name}.txt", ndmin=1), stored)
        mtx = np.asarray(scipy.io.mmread(tmp_path / f"{name}.mtx"))
        assert mtx.shape == (stored.size, 1)
        np.testing.assert_array_equal(mtx[:, 0], stored)
        np.testing.assert_array_equal(zarr.open_array(tmp_path / f"{name}.zarr")[:], stored[:, None])


def test_budget_too_small_for_chunks(tmp_path, npy):
    with pytest.raises(BudgetError, match=r"one block of 100 x 90.*at least \d+KiB.*smaller --chunks"):
        blocklin.convert(npy, tmp_path / "o.zarr", chunks=(100, 100), memory="64KiB")


@pytest.mark.parametrize("out", ["o.h5:/x", "o.csv", "o.mtx"])
def test_budget_refusal_of_a_file_export_suggests_no_chunks(tmp_path, npy, out):
    """A file export has no chunks: its budget refusal had said "one block of 1 x 1 (the output chunks)"
    (HDF5) and, for every file format, "or choose smaller --chunks", which cannot help. It names the
    budget that suffices, and that budget converts."""
    with pytest.raises(BudgetError) as info:
        blocklin.convert(npy, tmp_path / out, memory="16KiB")
    msg = str(info.value)
    assert "--chunks" not in msg and "the output chunks" not in msg and "1 x 1" not in msg, msg
    need = re.search(r"at least (\S+) \(--memory", msg).group(1)
    blocklin.convert(npy, tmp_path / out, memory=need)


# -- CLI -------------------------------------------------------------------------------------------

def test_cli_convert_json(tmp_path, npy, a, capsys):
    rc = main(["convert", str(npy), str(tmp_path / "o.zarr"), "--chunks", "32,32", "--codec", "zstd",
               "--memory", "1MiB", "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    for key in ("seconds", "bytes_read", "bytes_written", "peak_memory", "output"):
        assert key in summary
    assert summary["chunks"] == [32, 32] and summary["codec"] == "zstd"
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "o.zarr")[:], a)


def test_cli_raw_options_and_errors(tmp_path, a, capsys):
    np.asfortranarray(a).T.tofile(tmp_path / "a.bin")  # column-major bytes
    (tmp_path / "h.bin").write_bytes(b"HEADER" + np.asfortranarray(a).T.tobytes())
    assert main(["convert", str(tmp_path / "h.bin"), str(tmp_path / "o.npy"), "--shape", "120,90", "--dtype", "f8",
                 "--order", "F", "--offset", "6"]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), a)
    assert np.load(tmp_path / "o.npy").flags.f_contiguous  # the source order is kept
    capsys.readouterr()
    rc = main(["convert", str(tmp_path / "a.bin"), str(tmp_path / "p.zarr"), "--shape", "100,90", "--dtype", "f8"])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and "FormatError" in err and "Traceback" not in err
    assert not (tmp_path / "p.zarr").exists()
    assert main(["convert", str(tmp_path / "o.npy"), str(tmp_path / "o.npy"), "--overwrite"]) == 1
    assert "OutputIsInputError" in capsys.readouterr().err


def test_cli_csv_options(tmp_path, capsys):
    _write(tmp_path, "t.tsv", "title line\nx\ty\n1\t2\n3\t4\n")
    assert main(["convert", str(tmp_path / "t.tsv"), str(tmp_path / "t.zarr"), "--skip-rows", "1"]) == 0
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "t.zarr")[:], [[1, 2], [3, 4]])
    _write(tmp_path, "s.csv", "1;2\n3;4\n")
    assert main(["convert", str(tmp_path / "s.csv"), str(tmp_path / "s.npy"), "--delimiter", ";",
                 "--dtype", "int32", "--no-header"]) == 0
    got = np.load(tmp_path / "s.npy")
    assert got.dtype == np.int32 and got.tolist() == [[1, 2], [3, 4]]


@pytest.mark.parametrize("src, dtype, where", [
    (np.array([[1.5, np.nan], [-2.5, 3e10]]), "float16", "30000000000.0 at row 2, column 2"),
    (np.array([[1.0, -1e300]]), "float32", "-1e+300 at row 1, column 2"),
    (np.array([[1 + 1e300j]]), "complex64", "at row 1, column 1"),
    (np.array([[70000]], dtype=np.int64), "float16", "70000 at row 1, column 1"),
], ids=["f64-f16", "f64-f32", "c128-c64", "i64-f16"])
def test_convert_refuses_a_float_narrowing_that_overflows(tmp_path, src, dtype, where, capsys):
    # a finite value that the cast to a narrower float turns into Inf is refused with its position, as an
    # integer that does not fit is (it had been written as Inf, with at most NumPy's overflow warning);
    # Inf and NaN already in the data, and values that fit, convert as before
    np.save(tmp_path / "a.npy", src)
    out = tmp_path / "o.zarr"
    with pytest.raises(DTypeError, match=rf"values must fit {dtype} \(magnitudes up to .*{re.escape(where)}"):
        blocklin.convert(tmp_path / "a.npy", out, dtype=dtype)
    assert not out.exists() and not list(tmp_path.glob(".o.zarr.partial-*"))
    assert main(["convert", str(tmp_path / "a.npy"), str(out), "--dtype", dtype, "--no-progress"]) == 1
    assert "Fix: pick a wider dtype" in capsys.readouterr().err and not out.exists()
    fits = np.array([[np.inf, np.nan], [-np.inf, 1.0]])
    np.save(tmp_path / "f.npy", fits)
    blocklin.convert(tmp_path / "f.npy", tmp_path / "f.zarr", dtype=dtype)
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "f.zarr")[:], fits.astype(dtype))


@pytest.mark.parametrize("src,dst", [("float32", "float64"), ("complex64", "complex128"), ("float32", "complex128")])
def test_a_widening_convert_warns_of_nothing(tmp_path, src, dst):
    """The range check of a float cast compared a float32 maximum with float64's, which NumPy 2 casts to
    float32: every widening convert warned "overflow encountered in cast" over data that fits."""
    import warnings

    a = np.arange(12, dtype=src).reshape(3, 4) / 3
    np.save(tmp_path / "a.npy", a)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        blocklin.convert(tmp_path / "a.npy", tmp_path / "w.zarr", dtype=dst)
    got = blocklin.open(str(tmp_path / "w.zarr")).to_numpy()
    assert got.dtype == np.dtype(dst) and np.array_equal(got, a.astype(dst))  # a widening is exact
