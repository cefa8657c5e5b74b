"""Outputs never destroy what blocklin did not write (``blocklin.storage.guard``).

The probe cases, each through the CLI (``main([...])`` returns the exit code: 1 for an error) and the
Python API: an output inside an input, holding the inputs, an existing folder or file that is not a
blocklin output, an HDF5 file's other datasets; the same on S3 (moto on 127.0.0.1). After every
refusal the whole folder tree (or bucket) is byte-for-byte what it was. Then what ``overwrite`` may
still replace: a blocklin output (locally and on S3), an empty folder, a file of the output's format,
one HDF5 dataset.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time

import numpy as np
import pytest
import zarr

import blocklin as bl
from blocklin.cli.main import main
from blocklin.errors import OutputExistsError, OutputIsInputError, ParameterError, TempDirError
from blocklin.storage.backend import backend
from blocklin.storage.guard import relation, removal_command
from support.interrupts import backdate
from support.tolerances import assert_product

RNG = np.random.default_rng(5)
A = RNG.standard_normal((24, 16))
B = RNG.standard_normal((16, 12))
EXIT_ERROR = 1  # blocklin.cli.ui: every refused command exits 1 with a one-line message


def tree(root) -> dict[str, str]:
    """Every file and folder under ``root``: relative path -> content hash ("dir" for folders)."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for d in dirs:
            out[os.path.relpath(os.path.join(folder, d), root)] = "dir"
        for f in files:
            p = os.path.join(folder, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


@pytest.fixture
def work(tmp_path):
    """A folder with blocklin inputs A.zarr and B.zarr and an unrelated notes.txt."""
    w = tmp_path / "w"
    w.mkdir()
    bl.from_array(A, w / "A.zarr", chunks=(8, 8))
    bl.from_array(B, w / "B.zarr", chunks=(8, 4))
    (w / "notes.txt").write_text("not blocklin's")
    return w


def refused_cli(capsys, root, argv, *needles):
    """Run the CLI; assert exit 1, a one-line error naming every needle, and ``root`` unchanged."""
    before = tree(root)
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == EXIT_ERROR, err
    assert err.count("\n") == 1 and "Fix:" in err and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)
    assert tree(root) == before
    return err


def refused_api(root, exc, call, *needles):
    before = tree(root)
    with pytest.raises(exc) as info:
        call()
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))
    assert "Fix:" in str(info.value)
    assert tree(root) == before
    return str(info.value)


def gemm_argv(w, out, *extra):
    return ["gemm", str(w / "A.zarr"), str(w / "B.zarr"), "-o", str(out), "--overwrite", *extra]


# -- the probe cases, locally ---------------------------------------------------------------------

def test_output_inside_an_input_is_refused(work, tmp_path, capsys):
    refused_cli(capsys, tmp_path, gemm_argv(work, work / "A.zarr" / "sub"), "OutputIsInputError",
                "must not be inside an input")
    refused_api(tmp_path, OutputIsInputError,
                lambda: bl.matmul(work / "A.zarr", work / "B.zarr", work / "A.zarr" / "sub", overwrite=True),
                "inside the input")
    np.testing.assert_array_equal(bl.open(work / "A.zarr").to_numpy(), A)  # A still reads its data


def test_output_holding_the_inputs_is_refused(work, tmp_path, capsys):
    refused_cli(capsys, tmp_path, gemm_argv(work, work), "must not hold an input", f"{work}/C.zarr")
    refused_api(tmp_path, OutputIsInputError,
                lambda: bl.matmul(work / "A.zarr", work / "B.zarr", work, overwrite=True), "holds the input")
    refused_api(tmp_path, OutputIsInputError,  # also a folder further up
                lambda: bl.matmul(work / "A.zarr", work / "B.zarr", tmp_path, overwrite=True), "holds the input")


def test_output_through_a_symlink_to_an_input_is_refused(work, tmp_path, capsys):
    os.symlink(work / "A.zarr", tmp_path / "link.zarr")
    refused_cli(capsys, tmp_path, gemm_argv(work, tmp_path / "link.zarr"), "must differ from every input")
    os.symlink(work, tmp_path / "wlink")
    refused_api(tmp_path, OutputIsInputError,
                lambda: bl.matmul(work / "A.zarr", work / "B.zarr", tmp_path / "wlink" / "A.zarr" / "c", overwrite=True),
                "inside the input")


def test_overwrite_refuses_a_symlink_to_a_blocklin_output(work, tmp_path, capsys):
    """``--overwrite`` onto a link to a zarr output blocklin wrote had replaced the link (not blocklin's)
    with a new store and left its target as it was, exit 0. Refused now, the link and its target intact."""
    old = tmp_path / "old.zarr"
    bl.from_array(A, old)
    before = open(old / "zarr.json", "rb").read()
    os.symlink(old, tmp_path / "link.zarr")
    refused_cli(capsys, tmp_path, gemm_argv(work, tmp_path / "link.zarr"), "OutputExistsError",
                "a symbolic link", f"rm {tmp_path / 'link.zarr'}")
    refused_api(tmp_path, OutputExistsError, lambda: bl.from_array(A, tmp_path / "link.zarr", overwrite=True),
                "a symbolic link")
    assert os.readlink(tmp_path / "link.zarr") == str(old) and open(old / "zarr.json", "rb").read() == before


def test_existing_folder_that_is_not_a_zarr_store_is_refused(work, tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "thesis.tex").write_text("\\documentclass{article}")
    err = refused_cli(capsys, tmp_path, gemm_argv(work, docs), "OutputExistsError", "thesis.tex",
                      "overwrite replaces only a zarr output blocklin wrote", f"rm -r {docs}")
    assert "an empty folder" in err
    refused_api(tmp_path, OutputExistsError,
                lambda: bl.matmul(work / "A.zarr", work / "B.zarr", docs, overwrite=True), f"rm -r {docs}")
    refused_api(tmp_path, OutputExistsError, lambda: bl.from_array(A, docs, overwrite=True), "thesis.tex")
    refused_api(tmp_path, OutputExistsError, lambda: bl.random(docs, (4, 4), overwrite=True), "thesis.tex")


def test_plain_zarr_array_is_the_users_data(work, tmp_path, capsys):
    """A zarr array blocklin did not write (no provenance) is refused even with --overwrite."""
    plain = tmp_path / "plain.zarr"
    z = zarr.create_array(plain, shape=(4, 4), chunks=(2, 2), dtype="f8")
    z[...] = 7.0
    refused_cli(capsys, tmp_path, gemm_argv(work, plain), "blocklin did not write", f"rm -r {plain}")
    refused_api(tmp_path, OutputExistsError, lambda: bl.from_array(A, plain, overwrite=True), "blocklin did not write")
    refused_cli(capsys, tmp_path, ["convert", str(work / "A.zarr"), str(plain), "--overwrite"], "blocklin did not write")
    assert (zarr.open_array(plain)[...] == 7.0).all()


def test_a_blocklin_output_holding_other_files_is_refused(work, tmp_path, capsys):
    """Provenance alone is not enough: files someone put inside a blocklin output are theirs."""
    out = tmp_path / "C.zarr"
    bl.matmul(work / "A.zarr", work / "B.zarr", out)
    (out / "my-notes.txt").write_text("mine")
    refused_cli(capsys, tmp_path, gemm_argv(work, out), "blocklin did not write (my-notes.txt)", f"rm -r {out}")
    (out / "my-notes.txt").unlink()
    assert main(gemm_argv(work, out)) == 0


def test_an_array_put_inside_a_blocklin_output_is_not_blocklins(work, tmp_path, capsys):
    """Keys that look like blocklin's (``zarr.json``, ``c/0/0``) are blocklin's only at the root and
    in the member arrays its commit listed: a zarr array, another blocklin output or a folder named
    like chunks that someone put inside an output survives ``overwrite`` (refused, tree unchanged);
    a group output (svd's U, S, Vt) is still replaced whole."""
    out = tmp_path / "C.zarr"
    bl.matmul(work / "A.zarr", work / "B.zarr", out)
    notes = zarr.create_array(str(out / "notes"), shape=(3,), chunks=(3,), dtype="i4")
    notes[:] = [1, 2, 3]
    refused_cli(capsys, tmp_path, gemm_argv(work, out), "blocklin did not write (notes/c/0, notes/zarr.json)")
    refused_api(tmp_path, OutputExistsError, lambda: bl.matmul(work / "A.zarr", work / "B.zarr", out, overwrite=True),
                "blocklin did not write")
    inner = tmp_path / "D.zarr"
    bl.matmul(work / "A.zarr", work / "B.zarr", inner)
    bl.from_array(A, inner / "inner.zarr")  # a blocklin output of its own, inside another
    (inner / "mine" / "c" / "0").mkdir(parents=True)
    (inner / "mine" / "c" / "0" / "0").write_text("named like a chunk")
    refused_cli(capsys, tmp_path, gemm_argv(work, inner), "inner.zarr/c/0/0", "mine/c/0/0")
    svd = tmp_path / "S.zarr"
    bl.svd(work / "A.zarr", 3, out=svd, seed=0)
    assert zarr.open_group(str(svd)).attrs["blocklin"]["members"] == ["S", "U", "Vt"]
    zarr.create_array(str(svd / "mine"), shape=(2,), chunks=(2,), dtype="f8")
    refused_api(tmp_path, OutputExistsError, lambda: bl.svd(work / "A.zarr", 3, out=svd, seed=0, overwrite=True),
                "blocklin did not write (mine/zarr.json)")
    shutil.rmtree(svd / "mine")
    old = (svd / "zarr.json").stat().st_ino
    bl.svd(work / "A.zarr", 3, out=svd, seed=1, overwrite=True)
    assert (svd / "zarr.json").stat().st_ino != old  # replaced by the new run's commit
    assert sorted(os.listdir(svd)) == ["S", "U", "Vt", "zarr.json"]


def test_a_file_where_a_zarr_folder_would_go_is_refused(work, tmp_path, capsys):
    (tmp_path / "C.zarr").write_text("a file")
    refused_cli(capsys, tmp_path, gemm_argv(work, tmp_path / "C.zarr"), "a file, where a zarr folder would go",
                f"rm {tmp_path / 'C.zarr'}")


def test_output_is_not_the_temp_dir_and_the_temp_dir_not_an_input(work, tmp_path, capsys):
    tmp = tmp_path / "blocklin-tmp"  # the conftest's temp dir
    refused_api(tmp_path, TempDirError, lambda: bl.matmul(work / "A.zarr", work / "B.zarr", tmp, overwrite=True),
                "must not be the temp dir")
    refused_cli(capsys, tmp_path, gemm_argv(work, work / "T", "--temp-dir", str(work / "T" / "tmp")), "temp dir")
    refused_api(tmp_path, TempDirError, lambda: bl.matmul(work / "A.zarr", work / "B.zarr", tmp_path / "C.zarr",
                                                          temp_dir=work / "A.zarr"),
                "temp_dir: must not be an input or inside one")
    assert not os.listdir(tmp)


def test_two_outputs_of_one_operation_never_overlap(work, tmp_path):

    bl.from_array(A, tmp_path / "R.zarr")  # a blocklin output that --overwrite may replace
    for q in (tmp_path / "R.zarr", tmp_path / "R.zarr" / "Q"):
        refused_api(tmp_path, ParameterError, lambda: bl.qr(work / "A.zarr", tmp_path / "R.zarr", q=q, mode="reduced",
                                                            overwrite=True), "outputs: must not overlap each other")


def test_dask_array_cannot_overwrite_its_own_source(work, tmp_path):
    import dask.array as da

    x = da.from_zarr(str(work / "A.zarr"))
    refused_api(tmp_path, OutputIsInputError, lambda: bl.from_array(x, work / "A.zarr", overwrite=True),
                "must differ from every input")
    refused_api(tmp_path, OutputIsInputError, lambda: bl.from_array(x, work, overwrite=True), "holds the input")
    np.testing.assert_array_equal(bl.from_array(x, work / "copy.zarr").to_numpy(), A)


def test_a_stored_array_read_whole_is_an_input_of_from_array(work, tmp_path):
    """A Matrix or a zarr array given to ``from_array`` is read whole, then written: it is an input
    all the same, which ``overwrite`` never replaces (its chunks, provenance and history would go)."""
    for x in (bl.open(work / "A.zarr"), zarr.open_array(str(work / "A.zarr"), mode="r")):
        refused_api(tmp_path, OutputIsInputError, lambda: bl.from_array(x, work / "A.zarr", overwrite=True),
                    "must differ from every input")
        refused_api(tmp_path, OutputIsInputError, lambda: bl.from_array(x, work, overwrite=True), "holds the input")
    np.testing.assert_array_equal(bl.from_array(bl.open(work / "A.zarr"), tmp_path / "copy.zarr").to_numpy(), A)


def test_output_in_an_archive_or_on_the_web_is_refused_by_name(work, tmp_path, capsys):
    """``zip://A.zarr::/d/data.npz`` names a member of a local archive (here, beside the inputs): zarr
    failed with a bare ``ValueError`` (write() requires mode 'w') naming no parameter."""
    np.savez(work / "data.npz", a=A)
    for out in (f"zip://C.zarr::{work / 'data.npz'}", f"tar://C.zarr::{work / 'data.tar'}", "https://example.org/C.zarr"):
        refused_api(tmp_path, ParameterError, lambda: bl.matmul(work / "A.zarr", work / "B.zarr", out),
                    "out: must be a local path or a URL of writable storage", "is read-only")
        refused_cli(capsys, tmp_path, ["convert", str(work / "A.zarr"), out], "is read-only")


# -- convert and the file formats -------------------------------------------------------------------

def test_hdf5_output_keeps_the_files_other_datasets(tmp_path, capsys):
    h5py = pytest.importorskip("h5py")
    x = RNG.standard_normal((6, 5))
    np.save(tmp_path / "X.npy", x)
    out = tmp_path / "out.h5"
    np.save(tmp_path / "P.npy", np.arange(10.0).reshape(10, 1))
    np.save(tmp_path / "I.npy", np.ones((3, 1)))
    bl.convert(tmp_path / "P.npy", f"{out}:/precious")  # a file blocklin created, datasets it wrote
    bl.convert(tmp_path / "I.npy", f"{out}:/grp/inner")
    assert main(["convert", str(tmp_path / "X.npy"), f"{out}:/new", "--overwrite"]) == 0
    with h5py.File(out, "r") as f:
        assert sorted(f) == ["grp", "new", "precious"]
        np.testing.assert_array_equal(f["precious"][...], np.arange(10.0).reshape(10, 1))
        np.testing.assert_array_equal(f["grp/inner"][...], np.ones((3, 1)))
        np.testing.assert_array_equal(f["new"][...], x)  # a copy: bit for bit
    # Again without --overwrite: the dataset exists, refused; with it, only /new is replaced.
    refused_cli(capsys, tmp_path, ["convert", str(tmp_path / "X.npy"), f"{out}:/new"], "dataset", "exists")
    np.save(tmp_path / "Y.npy", 2 * x)
    bl.convert(tmp_path / "Y.npy", f"{out}:/new", overwrite=True)
    with h5py.File(out, "r") as f:
        assert sorted(f) == ["grp", "new", "precious"]
        np.testing.assert_array_equal(f["new"][...], 2 * x)
        np.testing.assert_array_equal(f["precious"][...], np.arange(10.0).reshape(10, 1))
    # A group at the name holds other data: never replaced.
    refused_cli(capsys, tmp_path, ["convert", str(tmp_path / "X.npy"), f"{out}:/grp", "--overwrite"], "a group")
    refused_cli(capsys, tmp_path, ["convert", str(tmp_path / "X.npy"), f"{out}:/precious/x", "--overwrite"],
                "parents must be groups")
    # The input's own file is the input.
    refused_cli(capsys, tmp_path, ["convert", f"{out}:/precious", f"{out}:/copy", "--overwrite"],
                "must differ from every input")


def test_hdf5_replacement_keeps_the_old_dataset_until_the_new_one_is_complete(tmp_path):
    h5py = pytest.importorskip("h5py")
    from blocklin.storage.formats import open_writer

    out = tmp_path / "out.h5"
    np.save(tmp_path / "D.npy", np.full((40, 3), 5.0))
    np.save(tmp_path / "P.npy", np.arange(4.0).reshape(4, 1))
    bl.convert(tmp_path / "D.npy", f"{out}:/d")  # a file blocklin created
    bl.convert(tmp_path / "P.npy", f"{out}:/precious")
    new = RNG.standard_normal((40, 3))
    # Interrupted after half the blocks: the old dataset is whole, no temporary dataset stays.
    w = open_writer(f"{out}:/d", (40, 3), "f8", overwrite=True)
    w.write(slice(0, 20), slice(0, 3), new[:20])
    np.testing.assert_array_equal(w._f["d"][...], np.full((40, 3), 5.0))  # the new rows went elsewhere
    w.abort()
    with h5py.File(out, "r") as f:
        assert sorted(f) == ["d", "precious"]
        np.testing.assert_array_equal(f["d"][...], np.full((40, 3), 5.0))
    # Completed: the new dataset takes the name; the other dataset is untouched.
    w = open_writer(f"{out}:/d", (40, 3), "f8", overwrite=True)
    w.write(slice(0, 20), slice(0, 3), new[:20])
    w.write(slice(20, 40), slice(0, 3), new[20:])
    w.commit()
    with h5py.File(out, "r") as f:
        assert sorted(f) == ["d", "precious"]
        np.testing.assert_array_equal(f["d"][...], new)
        np.testing.assert_array_equal(f["precious"][...], np.arange(4.0).reshape(4, 1))


def test_hdf5_path_holding_another_file_is_refused(tmp_path, capsys):
    pytest.importorskip("h5py")
    np.save(tmp_path / "X.npy", A)
    (tmp_path / "notes.h5").write_text("not HDF5")
    refused_cli(capsys, tmp_path, ["convert", str(tmp_path / "X.npy"), f"{tmp_path}/notes.h5:/d", "--overwrite"],
                "not an HDF5 file", f"rm {tmp_path / 'notes.h5'}")
    (tmp_path / "dir.h5").mkdir()
    refused_cli(capsys, tmp_path, ["convert", str(tmp_path / "X.npy"), f"{tmp_path}/dir.h5:/d", "--overwrite"],
                "a folder, where a file would go")


@pytest.mark.parametrize("ext,header", [("npy", b"\x93NUMPY"), ("mtx", b"%%MatrixMarket"),
                                        ("csv", repr(float(A[0, 0])).encode() + b",")])
def test_file_exports_replace_only_a_file_of_their_format(work, tmp_path, capsys, ext, header):
    out = tmp_path / f"out.{ext}"
    argv = ["convert", str(work / "A.zarr"), str(out), "--overwrite"]
    out.mkdir()
    (out / "keep.txt").write_text("keep")
    refused_cli(capsys, tmp_path, argv, "a folder, where a file would go", f"rm -r {out}")
    (out / "keep.txt").unlink()
    out.rmdir()
    out.write_bytes(b"\x00\x01binary, not this format\x00")
    refused_cli(capsys, tmp_path, argv, "OutputExistsError", f"rm {out}")
    # blocklin's own export (its record matches) is what --overwrite of an export replaces.
    out.unlink()
    assert main(["convert", str(work / "A.zarr"), str(out)]) == 0
    assert out.read_bytes().startswith(header)
    capsys.readouterr()
    assert main(argv) == 0
    assert main(["convert", str(out), str(tmp_path / "back.zarr")]) == 0
    # every format round-trips exactly (text holds the shortest repr that reads back to the same float64)
    np.testing.assert_array_equal(bl.open(tmp_path / "back.zarr").to_numpy(), A)


def test_convert_output_inside_or_holding_its_input_is_refused(work, tmp_path, capsys):
    refused_cli(capsys, tmp_path, ["convert", str(work / "A.zarr"), str(work / "A.zarr" / "r.zarr"), "--overwrite"],
                "must not be inside an input")
    np.save(work / "X.npy", A)
    refused_cli(capsys, tmp_path, ["convert", str(work / "X.npy"), str(work), "--to", "zarr", "--overwrite"],
                "must not hold an input")


# -- file exports: overwrite replaces blocklin's own file only --------------------------------------

#: Files of each export format another program wrote (what a user keeps at such a path).
FOREIGN = {"npy": None, "mtx": b"%%MatrixMarket matrix array real general\n1 1\n7\n", "csv": b"1,2\n3,4\n",
           "tsv": b"1\t2\n3\t4\n", "bin": np.arange(6.0).tobytes()}


def _foreign(path, ext):
    if ext == "npy":
        np.save(path, np.arange(6.0).reshape(2, 3))
    else:
        path.write_bytes(FOREIGN[ext])
    return path.read_bytes()


def _read_back(path, ext, tmp_path):
    extra = ["--shape", "24,16", "--dtype", "f8"] if ext == "bin" else []
    back = tmp_path / "back.zarr"
    assert main(["convert", str(path), str(back), "--overwrite", *extra]) == 0
    return bl.open(back).to_numpy()


@pytest.mark.parametrize("ext", sorted(FOREIGN))
def test_overwrite_refuses_a_file_blocklin_did_not_write(work, tmp_path, capsys, ext):
    """A file of the export's format that another program wrote is the user's: --overwrite (CLI and API)
    refuses it, the file byte-for-byte as it was; an empty file holds nothing and is replaced."""
    out = tmp_path / f"out.{ext}"
    before = _foreign(out, ext)
    record = f".out.{ext}.blocklin"
    refused_cli(capsys, tmp_path, ["convert", str(work / "A.zarr"), str(out), "--overwrite"], "OutputExistsError",
                "blocklin did not write", f"no record {record}", f"rm {out}")
    refused_api(tmp_path, OutputExistsError, lambda: bl.convert(work / "A.zarr", out, overwrite=True),
                "blocklin did not write", f"rm {out}")
    assert out.read_bytes() == before and not (tmp_path / record).exists()
    out.write_bytes(b"")
    assert main(["convert", str(work / "A.zarr"), str(out), "--overwrite"]) == 0
    np.testing.assert_array_equal(_read_back(out, ext, tmp_path), A)
    assert (tmp_path / record).exists()


@pytest.mark.parametrize("ext", sorted(FOREIGN))
def test_overwrite_replaces_blocklins_export_until_someone_changes_it(work, tmp_path, capsys, ext):
    """blocklin's own export is replaced (CLI, API); once another program rewrote it (appended to it, wrote
    it again later, or put another file at its name) it is refused like any file of the user's."""
    out = tmp_path / f"out.{ext}"
    assert main(["convert", str(work / "A.zarr"), str(out)]) == 0
    assert main(["convert", str(work / "A.zarr"), str(out), "--overwrite"]) == 0
    bl.convert(work / "A.zarr", out, overwrite=True)
    np.testing.assert_array_equal(_read_back(out, ext, tmp_path), A)

    def changed(*needles):
        refused_cli(capsys, tmp_path, ["convert", str(work / "A.zarr"), str(out), "--overwrite"], *needles)
        refused_api(tmp_path, OutputExistsError, lambda: bl.convert(work / "A.zarr", out, overwrite=True), *needles)

    with open(out, "ab") as f:  # appended to
        f.write(b"\n")
    changed("a file blocklin wrote that changed since", f"rm {out}")
    for case in ("rewritten", "replaced"):
        out.unlink()
        assert main(["convert", str(work / "A.zarr"), str(out)]) == 0
        if case == "rewritten":  # the same bytes written again later: only its times tell
            data, st = out.read_bytes(), out.stat()
            out.write_bytes(data)
            os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a later write, on any clock resolution
        else:  # another file renamed to its name (the same bytes, another inode)
            copy = tmp_path / "copy"
            copy.write_bytes(out.read_bytes())
            os.replace(copy, out)
        changed("changed since")


@pytest.mark.parametrize("ext", ["mtx", "npz"])
def test_sparse_export_replaces_only_its_own_file(tmp_path, capsys, ext):
    """A sparse group exported as coordinate .mtx or SciPy .npz follows the same rule: another program's
    file of that format (or any other file) is refused, blocklin's own export is replaced."""
    coo = tmp_path / "s.mtx"
    coo.write_text("%%MatrixMarket matrix coordinate real general\n3 4 2\n1 1 1.5\n3 4 -2\n")
    bl.convert(coo, tmp_path / "S.zarr")
    out = tmp_path / f"out.{ext}"
    if ext == "npz":
        np.savez(out, theirs=np.ones(3))
    else:
        out.write_bytes(FOREIGN["mtx"])
    argv = ["convert", str(tmp_path / "S.zarr"), str(out), "--overwrite"]
    refused_cli(capsys, tmp_path, argv, "blocklin did not write", f"rm {out}")
    out.write_bytes(b"\x00 not a zip, not Matrix Market")
    refused_cli(capsys, tmp_path, argv, "not a .npz file" if ext == "npz" else "not a Matrix Market file")
    out.unlink()
    assert main(argv[:-1]) == 0 and main(argv) == 0
    refused_api(tmp_path, OutputExistsError, lambda: bl.convert(tmp_path / "S.zarr", out), "--overwrite")


def test_hdf5_file_another_program_wrote_is_never_written_into(tmp_path, capsys):
    """An existing HDF5 file blocklin did not create is refused, for a new dataset as for an existing one,
    with or without --overwrite, the file byte-for-byte as it was; the fix writes a new file and copies."""
    h5py = pytest.importorskip("h5py")
    np.save(tmp_path / "X.npy", A)
    out = tmp_path / "theirs.h5"
    with h5py.File(out, "w") as f:
        f["x"] = np.arange(4.0)
    for member, extra in (("/y", []), ("/y", ["--overwrite"]), ("/x", ["--overwrite"])):
        refused_cli(capsys, tmp_path, ["convert", str(tmp_path / "X.npy"), f"{out}:{member}", *extra],
                    "an HDF5 file blocklin did not write", "never modified", "h5copy")
        refused_api(tmp_path, OutputExistsError,
                    lambda: bl.convert(tmp_path / "X.npy", f"{out}:{member}", overwrite=bool(extra)),
                    "an HDF5 file blocklin did not write", "h5copy")
    with h5py.File(out, "r") as f:
        assert list(f) == ["x"]


def test_hdf5_file_blocklin_created_takes_more_datasets_until_changed(tmp_path, capsys):
    h5py = pytest.importorskip("h5py")
    from blocklin.storage import file_records

    np.save(tmp_path / "X.npy", A)
    out = tmp_path / "mine.h5"
    bl.convert(tmp_path / "X.npy", f"{out}:/a")
    assert main(["convert", str(tmp_path / "X.npy"), f"{out}:/g/b"]) == 0  # another dataset, CLI
    bl.convert(tmp_path / "X.npy", f"{out}:/a", overwrite=True)  # one of its own replaced, API
    assert file_records.read(out)["datasets"] == ["/a", "/g/b"]
    with h5py.File(out, "r") as f:
        np.testing.assert_array_equal(f["a"][...], A)
        np.testing.assert_array_equal(f["g/b"][...], A)
    # A dataset of that file that blocklin did not write (its record does not list it) is not replaced.
    file_records.write(out, "hdf5", datasets=["/g/b"])
    refused_api(tmp_path, OutputExistsError, lambda: bl.convert(tmp_path / "X.npy", f"{out}:/a", overwrite=True),
                "'" + f"{out}:/a" + "', which blocklin did not write")
    # Changed by another program since: the whole file is the user's now.
    with h5py.File(out, "a") as f:
        f["theirs"] = np.ones(3)
    refused_cli(capsys, tmp_path, ["convert", str(tmp_path / "X.npy"), f"{out}:/c"], "changed since", "h5copy")
    refused_api(tmp_path, OutputExistsError, lambda: bl.convert(tmp_path / "X.npy", f"{out}:/g/b", overwrite=True),
                "changed since")


def test_hdf5_write_killed_in_place_leaves_the_file_refused_by_name(tmp_path):
    """A write into blocklin's file that never closed it (killed) leaves the record marked: the file may
    have been changed by anything since, so it is refused, naming the interrupted write; a write that
    failed or was stopped (abort) records the file again and the file stays blocklin's."""
    pytest.importorskip("h5py")
    from blocklin.storage.formats import open_writer

    np.save(tmp_path / "X.npy", A)
    out = tmp_path / "mine.h5"
    bl.convert(tmp_path / "X.npy", f"{out}:/a")
    w = open_writer(f"{out}:/b", A.shape, "f8")
    w.write(slice(0, 24), slice(0, 16), A)
    w.abort()
    bl.convert(tmp_path / "X.npy", f"{out}:/b")  # still blocklin's file
    w = open_writer(f"{out}:/c", A.shape, "f8")
    w.write(slice(0, 24), slice(0, 16), A)
    w._f.close()  # what a SIGKILL leaves: the file changed, the record still says "writing"
    refused_api(tmp_path, OutputExistsError, lambda: bl.convert(tmp_path / "X.npy", f"{out}:/d"),
                "blocklin was writing /c into in place", f"pid {os.getpid()}")


# -- what --overwrite still replaces -------------------------------------------------------------

def test_overwrite_replaces_a_blocklin_output_and_an_empty_folder(work, tmp_path, capsys):
    out = tmp_path / "C.zarr"
    assert main(gemm_argv(work, out)[:-1]) == 0
    assert main(gemm_argv(work, out)) == 0
    c = bl.open(out)
    assert c.provenance["operation"] == "matmul"
    assert_product(c.to_numpy(), A @ B, A, B)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(gemm_argv(work, empty)) == 0
    assert_product(bl.open(empty).to_numpy(), A @ B, A, B)
    # from_array and random over their own earlier outputs (both record provenance)
    m = bl.from_array(A, tmp_path / "F.zarr")
    assert m.provenance["operation"] == "from_array"
    np.testing.assert_array_equal(bl.from_array(2 * A, tmp_path / "F.zarr", overwrite=True).to_numpy(), 2 * A)
    r1 = bl.random(tmp_path / "R.zarr", (10, 6), seed=1, chunks=(5, 6)).to_numpy()
    r2 = bl.random(tmp_path / "R.zarr", (10, 6), seed=2, chunks=(5, 6), overwrite=True)
    assert r2.provenance["operation"] == "random" and not np.array_equal(r2.to_numpy(), r1)
    assert (work / "notes.txt").read_text() == "not blocklin's"


def test_output_beside_an_input_with_a_longer_name_is_not_inside_it(work, tmp_path):
    c = bl.matmul(work / "A.zarr", work / "B.zarr", work / "A.zarr2")
    assert_product(c.to_numpy(), A @ B, A, B)


def test_relation_compares_components():
    assert relation("s3://b/x/y", "s3://b/x") == "inside"
    assert relation("s3://b/x", "s3://b/x/y") == "contains"
    assert relation("s3://b/xy", "s3://b/x") is None
    assert relation("s3://b/x/", "s3://b//x") == "same"
    assert relation("s3a://b/x", "s3://b/x") == "same"
    assert relation("gs://b/x", "s3://b/x") is None
    assert relation("/tmp/ab", "/tmp/a") is None
    assert relation("file:///tmp/a/b", "/tmp/a") == "inside"
    assert relation("/tmp/f.h5:/d", "/tmp/f.h5") == "same"
    assert removal_command("s3://b/x") == "aws s3 rm --recursive s3://b/x/"  # the slash spares s3://b/xy
    assert removal_command("file:///tmp/my data") == "rm -r '/tmp/my data'"


# -- object stores ---------------------------------------------------------------------------------

def bucket_state(url, opts):
    """Every object in the bucket of ``url``: key -> content hash."""
    import s3fs

    fs = s3fs.S3FileSystem(**opts)
    fs.invalidate_cache()
    bucket = url.split("://", 1)[1].split("/", 1)[0]
    return {k: hashlib.sha256(fs.cat_file(k)).hexdigest() for k in fs.find(bucket)}


@pytest.fixture
def s3work(s3):
    base, opts = s3
    bl.from_array(A, f"{base}/d/A.zarr", chunks=(8, 8), storage_options=opts)
    bl.from_array(B, f"{base}/d/B.zarr", chunks=(8, 4), storage_options=opts)
    backend(bl.storage.as_location(f"{base}/d", opts)).write_bytes("notes.txt", b"not blocklin's")
    so = [f"--storage-option={k}={v}" for k, v in opts.items()]
    return base, opts, so


def refused_s3(capsys, base, opts, argv, *needles):
    before = bucket_state(base, opts)
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == EXIT_ERROR, err
    assert "Fix:" in err and "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)
    assert bucket_state(base, opts) == before
    return err


def test_s3_output_inside_or_holding_an_input_is_refused(s3work, capsys):
    base, opts, so = s3work
    ab = [f"{base}/d/A.zarr", f"{base}/d/B.zarr"]
    refused_s3(capsys, base, opts, ["gemm", *ab, "-o", f"{base}/d/A.zarr/sub", "--overwrite", *so],
               "must not be inside an input")
    refused_s3(capsys, base, opts, ["gemm", *ab, "-o", f"{base}/d", "--overwrite", *so], "must not hold an input")
    refused_s3(capsys, base, opts, ["gemm", *ab, "-o", f"{base}/d/", "--overwrite", *so], "must not hold an input")
    before = bucket_state(base, opts)
    with pytest.raises(OutputIsInputError, match="inside the input"):
        bl.matmul(*ab, f"{base}/d/B.zarr/c", overwrite=True, storage_options=opts)
    assert bucket_state(base, opts) == before


def test_s3_prefix_holding_other_data_is_refused(s3work, capsys):
    base, opts, so = s3work
    ab = [f"{base}/d/A.zarr", f"{base}/d/B.zarr"]
    plain = f"{base}/plain.zarr"
    z = zarr.create_array(zarr.storage.FsspecStore.from_url(plain, storage_options=opts), shape=(4, 4), chunks=(2, 2),
                          dtype="f8")
    z[...] = 3.0
    refused_s3(capsys, base, opts, ["gemm", *ab, "-o", plain, "--overwrite", *so], "blocklin did not write",
               f"aws s3 rm --recursive {plain}/")
    backend(bl.storage.as_location(f"{base}/docs", opts)).write_bytes("thesis.tex", b"\\documentclass")
    refused_s3(capsys, base, opts, ["gemm", *ab, "-o", f"{base}/docs", "--overwrite", *so], "other objects")
    # A blocklin output with an object someone added: that object is theirs.
    bl.from_array(A, f"{base}/mixed.zarr", storage_options=opts)
    backend(bl.storage.as_location(f"{base}/mixed.zarr", opts)).write_bytes("README", b"mine")
    refused_s3(capsys, base, opts, ["gemm", *ab, "-o", f"{base}/mixed.zarr", "--overwrite", *so],
               "blocklin did not write (README)")
    before = bucket_state(base, opts)
    with pytest.raises(OutputExistsError, match="blocklin did not write"):
        bl.from_array(A, plain, overwrite=True, storage_options=opts)
    assert bucket_state(base, opts) == before


def test_s3_array_put_inside_a_blocklin_output_is_not_blocklins(s3work, capsys):
    """The object-store commit lists a group output's member arrays too: an array someone added
    under the prefix later is refused by ``overwrite``, the group alone is replaced."""
    base, opts, so = s3work
    out = f"{base}/S.zarr"
    bl.svd(f"{base}/d/A.zarr", 3, out=out, seed=0, storage_options=opts)
    be = backend(bl.storage.as_location(out, opts))
    be.write_bytes("mine/zarr.json", be.read_bytes("S/zarr.json"))
    refused_s3(capsys, base, opts, ["svd", f"{base}/d/A.zarr", "-k", "3", "-o", out, "--overwrite", *so],
               "blocklin did not write (mine/zarr.json)")
    be.delete("mine/zarr.json")
    assert main(["svd", f"{base}/d/A.zarr", "-k", "3", "-o", out, "--overwrite", *so]) == 0
    assert json.loads(be.read_text("zarr.json"))["attributes"]["blocklin"]["members"] == ["S", "U", "Vt"]


def test_s3_overwrite_replaces_a_blocklin_output_and_spares_its_siblings(s3work, capsys):
    base, opts, so = s3work
    ab = [f"{base}/d/A.zarr", f"{base}/d/B.zarr"]
    out = f"{base}/C.zarr"
    bl.from_array(np.zeros((3, 3)), f"{base}/C.zarr2", storage_options=opts)  # a sibling sharing the name's start
    sibling = {k: v for k, v in bucket_state(base, opts).items() if "/C.zarr2/" in k}
    assert main(["gemm", *ab, "-o", out, *so]) == 0
    assert main(["gemm", *ab, "-o", out, "--overwrite", *so]) == 0
    c = bl.open(out, storage_options=opts)
    assert c.provenance["operation"] == "matmul"
    assert_product(c.to_numpy(), A @ B, A, B)
    assert {k: v for k, v in bucket_state(base, opts).items() if "/C.zarr2/" in k} == sibling
    assert backend(bl.storage.as_location(f"{base}/d", opts)).read_bytes("notes.txt") == b"not blocklin's"
    m = bl.from_array(2 * A, out, overwrite=True, storage_options=opts)  # from_array over a blocklin output
    np.testing.assert_array_equal(m.to_numpy(), 2 * A)


def test_demo_in_an_existing_folder_removes_only_its_own_stores(tmp_path, capsys):
    """``blocklin demo --dir DIR`` without --keep used to remove DIR whole."""
    d = tmp_path / "mine"
    d.mkdir()
    (d / "thesis.tex").write_text("keep")
    before = tree(d)
    temp = tmp_path / "temp"
    temp.mkdir()
    with bl.config.set(temp_dir=str(temp)):
        assert main(["demo", "--size", "256", "--memory", "1MiB", "--dir", str(d)]) == 0
    assert tree(d) == before
    assert list(temp.iterdir()) == []  # the verification's products were stores in the demo's folder too


def test_a_run_leaves_a_users_folder_named_like_its_partial_output(work, tmp_path, capsys):
    """A run removes the partial outputs that gone runs left beside its output, and takes over its own:
    only folders blocklin made (an owner record, or its token and a zarr store or nothing else), as
    ``blocklin clean`` decides. A user's ``.C.zarr.partial-...`` of notes had been removed as "the
    partial output of a run that is gone"; one under the run's own name had been written into."""
    from blocklin.storage.atomic import AtomicOutput

    out = tmp_path / "C.zarr"
    for name in (".C.zarr.partial-notes", ".C.zarr.partial-0123456789abcdef"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "notes.txt").write_text("mine")
    before = tree(tmp_path)
    assert main(gemm_argv(work, out)) == 0
    assert_product(bl.open(out).to_numpy(), A @ B, A, B)
    shutil.rmtree(out)
    assert tree(tmp_path) == before
    refused_api(tmp_path, OutputExistsError, lambda: AtomicOutput(out, token="0123456789abcdef"),
                "is not a partial output blocklin wrote", "mv ")
    gone = tmp_path / ".C.zarr.partial-fedcba9876543210"  # a gone run's (killed before its record)
    gone.mkdir()
    assert main(gemm_argv(work, out)) == 0 and not gone.exists()


def test_clean_leaves_a_dated_folder_that_looks_like_an_old_output(tmp_path):
    """``blocklin clean`` removes a record-less ``.NAME.old-ID`` folder only where it is what a commit sets
    aside (an output ``overwrite`` may replace): a user's dated backup ``.photos.old-20231225`` had been
    removed as an old output."""
    old = time.time() - 7200
    user = tmp_path / ".photos.old-20231225"
    user.mkdir()
    (user / "img.txt").write_text("mine")
    foreign = tmp_path / ".data.zarr.old-0badcafe"  # a zarr store another tool wrote
    zarr.create_array(str(foreign), shape=(2, 2), dtype="f8")
    ours = tmp_path / ".out.zarr.old-deadbeef"  # what a killed commit set aside: a blocklin output
    bl.from_array(np.ones((2, 2)), tmp_path / "x.zarr")
    os.rename(tmp_path / "x.zarr", ours)
    backdate((user, foreign, ours), old)
    assert main(["clean", str(tmp_path), "--no-progress"]) == 0
    assert (user / "img.txt").read_text() == "mine" and (foreign / "zarr.json").exists()
    assert not ours.exists()


@pytest.mark.parametrize("argv", [["svd", "I.zarr", "-k", "2", "-o", "I.zarr"], ["factor", "lu", "I.zarr", "-o", "I.zarr"],
                                  ["solve", "S.zarr", "J.zarr", "-o", "J.zarr"], ["pca", "I.zarr", "-k", "2", "-o", "I.zarr"]])
def test_an_integer_input_is_not_replaced_by_overwrite(tmp_path, capsys, argv):
    """Integer data is read through a staged float64 copy; the output is still checked against the stored
    array: ``svd I.zarr -o I.zarr --overwrite`` on an int32 matrix blocklin wrote had replaced it by the SVD."""
    w = tmp_path / "w"
    w.mkdir()
    ints = np.random.default_rng(3).integers(-9, 9, (16, 18))
    bl.from_array(ints[:, :16].astype(np.int32), w / "I.zarr", chunks=(8, 8))
    bl.from_array(ints[:, 16:].astype(np.int64), w / "J.zarr", chunks=(8, 2))
    bl.from_array(A[:16] @ A[:16].T + 16 * np.eye(16), w / "S.zarr", chunks=(8, 8))
    out = w / argv[argv.index("-o") + 1]
    argv = [str(w / a) if a.endswith(".zarr") else a for a in argv]
    refused_cli(capsys, w, argv + ["--overwrite", "--temp-dir", str(tmp_path), "--no-progress"],
                "also an input", "choose another output path")
    assert np.array_equal(zarr.open_array(str(out), mode="r")[...], ints[:, :16] if out.name == "I.zarr" else ints[:, 16:])


def _dry_run_items(folder, capsys) -> dict:
    """``blocklin clean FOLDER --dry-run --json``'s items by file name, with the folder checked untouched."""
    import json

    before = tree(folder)
    assert main(["clean", str(folder), "--dry-run", "--json"]) == 0
    items = {os.path.basename(i["path"]): i for i in json.loads(capsys.readouterr().out)["items"]}
    assert tree(folder) == before
    return items


def test_clean_removes_the_record_of_an_export_whose_file_is_gone(work, tmp_path, capsys):
    """A file export's record ``.NAME.blocklin`` outlived its file once the user removed the file (``blocklin
    clean`` neither reported nor removed it). ``clean`` removes such an orphan record (found in a folder it
    looks in, or beside the export's path); a record whose file exists stays, and a file of the user's with a
    record's name (not one blocklin wrote) is reported as skipped and left alone."""

    exp = tmp_path / "exp"
    exp.mkdir()
    for name in ("gone.npy", "kept.csv", "named.mtx"):
        assert main(["convert", str(work / "A.zarr"), str(exp / name)]) == 0
        assert (exp / f".{name}.blocklin").is_file()
    (exp / "gone.npy").unlink()
    (exp / "named.mtx").unlink()
    (exp / ".notes.txt.blocklin").write_text("my notes, no record")  # the user's, its 'file' absent
    (exp / ".list.json.blocklin").write_text('{"blocklin": "a tool of mine"}')  # JSON, not blocklin's record
    (exp / ".photos.blocklin").mkdir()  # a folder with a record's name
    capsys.readouterr()

    dry = _dry_run_items(exp, capsys)
    assert {k: (i["kind"], i["action"]) for k, i in dry.items()} == {
        ".gone.npy.blocklin": ("file record", "would remove"), ".named.mtx.blocklin": ("file record", "would remove"),
        ".notes.txt.blocklin": ("file record", "skipped"), ".list.json.blocklin": ("file record", "skipped"),
        ".photos.blocklin": ("file record", "skipped")}
    assert "gone.npy is gone" in dry[".gone.npy.blocklin"]["reason"]

    assert main(["clean", str(exp / "named.mtx"), "--no-progress"]) == 0  # beside the export's path
    assert "removed file record" in capsys.readouterr().out and not (exp / ".named.mtx.blocklin").exists()
    assert main(["clean", str(exp), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert f"removed file record {exp / '.gone.npy.blocklin'}" in text and "1 of 4 leftover(s) removed" in text
    assert not (exp / ".gone.npy.blocklin").exists()
    assert (exp / ".notes.txt.blocklin").read_text() == "my notes, no record"
    assert (exp / ".list.json.blocklin").read_text() == '{"blocklin": "a tool of mine"}'
    assert (exp / ".photos.blocklin").is_dir() and (exp / ".kept.csv.blocklin").is_file()
    assert "kept.csv" not in text  # a record whose file exists is no leftover
    # the kept record still marks kept.csv as blocklin's: --overwrite replaces it
    assert main(["convert", str(work / "A.zarr"), str(exp / "kept.csv"), "--overwrite"]) == 0
    assert main(["clean", str(exp), "--dry-run", "--no-progress"]) == 0
    assert "0 of 3 leftover(s) to remove" in capsys.readouterr().out


def test_clean_removes_the_temporary_copy_of_a_record_its_writer_left(work, tmp_path, capsys):
    """A file export's record and a partial file's owner record are written whole as ``NAME.tmp-PID-HEX`` and
    renamed into place; a writer killed between the two left that file, and ``clean`` did not see it. It now
    removes one older than the lease that holds the start of such a record (or nothing), keeps a recent one
    (its writer may be renaming it), and leaves a look-alike file of the user's alone."""

    exp = tmp_path / "exp"
    exp.mkdir()
    assert main(["convert", str(work / "A.zarr"), str(exp / "a.npy")]) == 0
    record = (exp / ".a.npy.blocklin").read_text()
    old = time.time() - 3600
    leftovers = {".a.npy.blocklin.tmp-4242-0123abcd": record[:20],  # killed mid-write
                 ".b.npy.blocklin.tmp-4243-89abcdef": "",  # killed before writing
                 ".c.npy.partial-0123456789abcdef.owner.tmp-4244-deadbeef": '{"pid": 4244, "ho'}
    for name, text in leftovers.items():
        (exp / name).write_text(text)
        os.utime(exp / name, (old, old))
    (exp / ".d.npy.blocklin.tmp-4245-00000000").write_text('{"pid": 4245}')  # recent: kept
    (exp / ".e.npy.blocklin.tmp-4246-11111111").write_text("the user's own notes")  # not blocklin's
    os.utime(exp / ".e.npy.blocklin.tmp-4246-11111111", (old, old))
    capsys.readouterr()

    dry = _dry_run_items(exp, capsys)
    assert {k: (i["kind"], i["action"]) for k, i in dry.items()} == {
        **{name: ("record temp", "would remove") for name in leftovers},
        ".d.npy.blocklin.tmp-4245-00000000": ("record temp", "kept"),
        ".e.npy.blocklin.tmp-4246-11111111": ("record temp", "skipped")}

    assert main(["clean", str(exp / "a.npy"), "--no-progress"]) == 0  # beside the export's path
    assert not (exp / ".a.npy.blocklin.tmp-4242-0123abcd").exists()
    assert main(["clean", str(exp), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "2 of 4 leftover(s) removed" in text, text
    assert sorted(os.listdir(exp)) == [".a.npy.blocklin", ".d.npy.blocklin.tmp-4245-00000000",
                                       ".e.npy.blocklin.tmp-4246-11111111", "a.npy"]
    assert (exp / ".e.npy.blocklin.tmp-4246-11111111").read_text() == "the user's own notes"
    assert (exp / ".a.npy.blocklin").read_text() == record


def _killed_export_partial(folder) -> str:
    """The partial file (with its owner record) of an ``.npy`` export to ``folder/out.npy`` whose process was
    killed (SIGKILL) before its commit or abort: a leftover blocklin owns, its run gone."""
    import signal
    import subprocess
    import sys

    script = ("import os, sys\n"
              "from blocklin.storage.formats.base import AtomicFile\n"
              "f = AtomicFile(sys.argv[1], kind='npy')\n"
              "f.partial.write_bytes(b'x' * 4096)\n"
              "os.kill(os.getpid(), 9)\n")
    r = subprocess.run([sys.executable, "-c", script, str(folder / "out.npy")], capture_output=True, timeout=120)
    assert r.returncode == -signal.SIGKILL
    (killed,) = [f for f in os.listdir(folder) if ".partial-" in f and not f.endswith(".owner")]
    assert os.path.exists(folder / f"{killed}.owner")
    return killed


@pytest.mark.parametrize("name", [".data.zarr.partial-notes", ".notes.txt.partial-draft", ".photos.old-20231225"])
def test_clean_of_a_path_blocklin_did_not_write_is_refused(tmp_path, capsys, name):
    """``blocklin clean PATH`` naming a look-alike of a leftover that blocklin did not write (a user's folder or
    file under a partial output's or an old output's name, no owner record) left it alone but exited 0 ("0 of 1
    leftover(s) removed"), as though it had done what was asked. Refused now (exit 1, one line naming the path,
    why and what to do) before anything is removed, also where an owned leftover is named beside it, which the
    same command without the foreign path cleans (exit 0)."""
    folder = tmp_path / "work"
    folder.mkdir()
    killed = _killed_export_partial(folder)
    foreign = folder / name
    if "notes.txt" in name:
        foreign.write_text("the user's draft")
    else:
        foreign.mkdir()
        (foreign / "img.txt").write_text("mine")
    backdate((foreign,), time.time() - 7200)
    for argv in ([str(foreign)], [str(folder / killed), str(foreign)]):
        refused_cli(capsys, tmp_path, ["clean", *argv, "--no-progress"], "path: must name a leftover blocklin wrote",
                    "clean removes nothing blocklin did not write", f"{foreign} (", "left alone", "remove it yourself")
        refused_cli(capsys, tmp_path, ["clean", *argv, "--dry-run", "--no-progress"], str(foreign))
    assert main(["clean", str(folder / killed), "--no-progress"]) == 0
    assert "removed partial file" in capsys.readouterr().out
    assert sorted(os.listdir(folder)) == [name]


def test_clean_removes_the_partial_of_a_killed_file_export(tmp_path, capsys):
    """A file export killed mid-write (SIGKILL) leaves ``.NAME.partial-TOKEN``, a file as large as the export:
    ``blocklin clean`` had said "nothing to clean" (it looked for folders only). The partial now carries its
    writer's owner record beside it until the commit or the abort; ``clean`` removes a gone run's partial
    with that record, keeps a live run's, and leaves a look-alike file of the user's alone."""
    tmp_path = tmp_path / "exports"  # beside the tests' own temp dir
    tmp_path.mkdir()
    killed = _killed_export_partial(tmp_path)
    from blocklin.storage.formats.base import AtomicFile

    live = AtomicFile(tmp_path / "live.npy", kind="npy")  # this process writes it: kept
    live.partial.write_bytes(b"y" * 10)
    (tmp_path / ".notes.txt.partial-draft").write_text("the user's")  # not blocklin's name
    assert main(["clean", str(tmp_path), "--dry-run", "--json"]) == 0
    items = {os.path.basename(i["path"]): i["action"] for i in json.loads(capsys.readouterr().out)["items"]}
    assert items == {killed: "would remove", live.partial.name: "kept", ".notes.txt.partial-draft": "skipped"}
    assert main(["clean", str(tmp_path / "out.npy")]) == 0
    assert "removed partial file" in capsys.readouterr().out
    assert sorted(os.listdir(tmp_path)) == sorted([".notes.txt.partial-draft", live.partial.name,
                                                   f"{live.partial.name}.owner"])
    live.abort()
    assert os.listdir(tmp_path) == [".notes.txt.partial-draft"]


def test_clean_of_a_path_that_does_not_exist_says_so(tmp_path, capsys):
    """``blocklin clean typo.zarr`` (no such path, nothing beside it) said "nothing to clean" and exited 0, as
    though the path had been looked at; it is refused (exit 1, one line naming it). A gone run's partial of an
    output that never appeared is still cleaned by naming that output."""
    folder = tmp_path / "work"
    folder.mkdir()
    typo = folder / "typo.zarr"
    refused_cli(capsys, tmp_path, ["clean", str(typo), "--no-progress"], f"{typo} (no such file or folder",
                "Fix: check the path")
    _killed_export_partial(folder)  # a gone run's partial of folder/out.npy, which never appeared
    assert not (folder / "out.npy").exists()
    capsys.readouterr()
    assert main(["clean", str(folder / "out.npy"), "--no-progress"]) == 0
    assert "removed partial file" in capsys.readouterr().out and os.listdir(folder) == []


def test_clean_of_an_ordinary_file_blocklin_did_not_write_says_so(tmp_path, capsys):
    """``blocklin clean notes.txt``, an ordinary file blocklin did not write, said "nothing to clean" and exited
    0, as though the file had been looked at and found clean. It is refused now (exit 1, one line naming the
    file, that blocklin did not write it and what clean looks for beside it), the file untouched; with a gone
    run's partial beside it that partial is removed, a line says the file was left alone, and the exit is 0.
    An output blocklin wrote (a ``.npy`` export with its record, a zarr store) is looked beside as before."""
    folder = tmp_path / "work"
    folder.mkdir()
    notes = folder / "notes.txt"
    notes.write_text("the user's notes")
    for argv in (["clean", str(notes)], ["clean", str(notes), "--dry-run"], ["clean", str(notes), str(folder)]):
        refused_cli(capsys, tmp_path, [*argv, "--no-progress"], f"{notes} (a file blocklin did not write",
                    "left alone", ".NAME.partial-*", "Fix:")
    _killed_export_partial(folder)  # a gone run's partial of folder/out.npy
    mine = folder / "out.npy"
    np.save(mine, np.arange(3.0))  # the user's own file of that name, no record
    body = mine.read_bytes()
    capsys.readouterr()
    assert main(["clean", str(mine), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "removed partial file" in out and f"{mine}: not a file blocklin wrote, left alone" in out
    assert sorted(os.listdir(folder)) == ["notes.txt", "out.npy"] and mine.read_bytes() == body
    assert notes.read_text() == "the user's notes"
    ours = bl.from_array(np.arange(6.0).reshape(2, 3), str(folder / "m.zarr"))
    bl.convert(ours.path, str(folder / "m.npy"))
    assert os.path.exists(folder / ".m.npy.blocklin")  # blocklin's record of its export
    for path in (folder / "m.npy", folder / "m.zarr"):
        assert main(["clean", str(path), "--no-progress"]) == 0
        out = capsys.readouterr().out
        assert "nothing to clean" in out and "not a file blocklin wrote" not in out
    assert np.load(folder / "m.npy").shape == (2, 3)
