"""Hostile command-line arguments: a value no rule admits is a usage error (exit 2) naming the option
as typed, an option the input does not use is refused rather than dropped, and a storage client's
own failure (no credentials) is one line, not a traceback. Nothing is written by a refused run."""

from __future__ import annotations

import os

import numpy as np
import pytest

from blocklin.cli.main import main
from support.hostile import assert_refused, leftovers, run_cli, write_zarr


@pytest.fixture
def stores(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((30, 20))
    write_zarr(tmp_path / "a.zarr", a, (10, 10))
    write_zarr(tmp_path / "s.zarr", a.T @ a + 20 * np.eye(20), (10, 10))
    write_zarr(tmp_path / "b.zarr", rng.standard_normal((20, 2)), (10, 2))
    np.save(tmp_path / "a.npy", a)
    return tmp_path


def _usage_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


REAL_OPTIONS = [
    (["gemm", "{d}/a.zarr", "{d}/a.zarr", "--trans-a", "-o", "{d}/out.zarr"], "--alpha", ["nan", "inf", "x"]),
    (["gemm", "{d}/a.zarr", "{d}/a.zarr", "--trans-a", "-o", "{d}/out.zarr", "--c", "{d}/s.zarr"], "--beta",
     ["nan", "-inf"]),
    (["svd", "{d}/a.zarr", "-k", "3", "-o", "{d}/out"], "--tol", ["nan", "inf", "0", "-1"]),
    (["pca", "{d}/a.zarr", "-k", "3", "-o", "{d}/out"], "--tol", ["nan", "-1e-3"]),
    (["eigs", "{d}/s.zarr", "-k", "3", "-o", "{d}/out"], "--tol", ["nan", "0"]),
    (["inv", "{d}/s.zarr", "-o", "{d}/out.zarr"], "--tol", ["nan", "-1"]),
    (["solve", "{d}/s.zarr", "{d}/b.zarr", "-o", "{d}/out.zarr"], "--tol", ["nan"]),
    (["solve", "{d}/s.zarr", "{d}/b.zarr", "-o", "{d}/out.zarr"], "--lambda", ["nan", "-1", "inf", "1,-2",
                                                                                "loo:1,nan"]),
    (["svd", "{d}/a.zarr", "-k", "3", "-o", "{d}/out"], "--seed", ["-1", "1.5"]),
    (["pca", "{d}/a.zarr", "-k", "3", "-o", "{d}/out"], "--seed", ["-2"]),
    (["eigs", "{d}/s.zarr", "-k", "3", "-o", "{d}/out"], "--seed", ["-5"]),
    (["demo", "--size", "64", "--dir", "{d}/demo"], "--seed", ["-1"]),
]


@pytest.mark.parametrize("argv, option, values", REAL_OPTIONS, ids=lambda x: x if isinstance(x, str) else None)
def test_real_options_refused_while_parsing(stores, argv, option, values, capsys):
    """NaN, infinite, negative (where the rule is > 0 or >= 0) and non-integer seeds: exit 2 naming the
    option as typed, with a fix, before any file is opened. They had reached the operation, which
    named its Python argument (``tol``, ``lam``; demo's seed named nothing) and exited 1."""
    for value in values:
        line = _usage_error([a.format(d=stores) for a in argv] + [option, value], capsys)
        assert f"argument {option}: must be" in line and f"Fix: pass {option} " in line, line
        assert repr(value) in line or value in line, line
        assert not {"out", "out.zarr", "demo"} & set(os.listdir(stores)) and not leftovers(stores)


@pytest.mark.parametrize("extra, flag", [
    (["--shape", "3,3"], "--shape"), (["--offset", "8"], "--offset"), (["--order", "F"], "--order"),
    (["--in-dtype", "float32"], "--in-dtype"), (["--delimiter", ","], "--delimiter"),
    (["--skip-rows", "2"], "--skip-rows"), (["--no-header"], "--header/--no-header"),
])
def test_convert_refuses_layout_options_its_input_does_not_use(stores, extra, flag, capsys):
    """``convert A.npy OUT --shape 3,3`` had written the 30 x 20 array the .npy holds, the option
    dropped without a word (a user who meant a raw read of 3 x 3 got something else); now refused,
    nothing written."""
    assert main(["convert", str(stores / "a.npy"), str(stores / "out.zarr"), *extra]) == 1
    err = capsys.readouterr().err
    assert f"error: ConfigError: {flag}: " in err and "read as npy" in err and "Fix: drop " in err, err
    assert not (stores / "out.zarr").exists() and not leftovers(stores)


def test_convert_keeps_the_options_its_output_uses(stores, capsys):
    """The delimiter of a CSV output and the order of a .npy output stay accepted."""
    assert main(["convert", str(stores / "a.npy"), str(stores / "out.csv"), "--delimiter", ";"]) == 0
    assert ";" in (stores / "out.csv").read_text().splitlines()[-1]
    assert main(["convert", str(stores / "a.npy"), str(stores / "f.npy"), "--out-order", "F"]) == 0
    np.testing.assert_array_equal(np.load(stores / "f.npy"), np.load(stores / "a.npy"))


@pytest.mark.parametrize("extra", [["--shape", "3,3"], ["--dtype", "int8"], ["--delimiter", ","]])
def test_info_refuses_layout_options_a_zarr_does_not_use(stores, extra, capsys):
    """``info A.zarr --shape 3,3`` had described the stored 30 x 20 array, the option ignored."""
    assert main(["info", str(stores / "a.zarr"), *extra]) == 1
    err = capsys.readouterr().err
    assert f"ConfigError: {extra[0]}: " in err and "read as zarr" in err, err


def test_object_store_without_credentials_is_one_line(stores, monkeypatch):
    """An s3:// input with no credentials anywhere: botocore's ``NoCredentialsError`` (not an
    ``OSError``) had escaped the CLI as a traceback; now one line naming the URL and how to pass them."""
    pytest.importorskip("s3fs")
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    env = {"AWS_SHARED_CREDENTIALS_FILE": str(stores / "none"), "AWS_CONFIG_FILE": str(stores / "none"),
           "AWS_EC2_METADATA_DISABLED": "true"}
    url = "s3://blocklin-no-such-bucket-for-tests/a.zarr"
    for argv in (["gemm", url, str(stores / "b.zarr"), "-o", str(stores / "c.zarr")], ["info", url]):
        assert_refused(run_cli(argv, stores, env=env), "StorageCredentialsError", url, "--storage-option")
    assert not (stores / "c.zarr").exists() and not leftovers(stores)


@pytest.mark.parametrize("argv", [["svd", "{d}/a.zarr", "-k", "3", "-o", "{d}/out"],
                                  ["eigs", "{d}/s.zarr", "-k", "3", "-o", "{d}/out"],
                                  ["solve", "{d}/s.zarr", "{d}/b.zarr", "-o", "{d}/out", "--lambda", "gcv"]])
def test_plot_path_checked_before_the_run(stores, argv, capsys):
    """``--plot`` into a missing folder had failed after the run (exit 1, the result written: work
    spent and an output left by a failed command); a folder had become ``FOLDER.png`` beside it. Both
    are usage errors now, before anything is read or written."""
    base = [a.format(d=stores) for a in argv]
    line = _usage_error(base + ["--plot", str(stores / "nodir" / "s.png")], capsys)
    assert "argument --plot: must be in an existing folder" in line and "Fix: " in line, line
    (stores / "figs").mkdir()
    line = _usage_error(base + ["--plot", str(stores / "figs")], capsys)
    assert "argument --plot: must be a file path, not a folder" in line, line
    assert not (stores / "out").exists() and not (stores / "figs.png").exists() and not leftovers(stores)


@pytest.mark.parametrize("command", ["svd", "solve"])
def test_plot_outside_the_output_checked_before_the_run(stores, command, capsys):
    """``-o x.png --plot x.png`` had written the results, then refused the plot as an existing file
    (exit 1 after a complete run, the output left); ``--plot`` inside the output's store (with
    ``--overwrite``) had been drawn into the new store. Both are refused before anything is written."""
    base = {"svd": ["svd", str(stores / "a.zarr"), "-k", "3"],
            "solve": ["solve", str(stores / "s.zarr"), str(stores / "b.zarr"), "--lambda", "gcv"]}[command]
    out = stores / "x.png"
    assert main(base + ["-o", str(out), "--plot", str(out)]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "ParameterError: --plot: must lie outside the command's output" in line and "the same path as" in line \
        and "Fix: " in line, line
    assert not out.exists() and not leftovers(stores)
    (stores / "old.zarr").mkdir()
    assert main(base + ["-o", str(stores / "old.zarr"), "--plot", str(stores / "old.zarr" / "p.png"),
                        "--overwrite"]) == 1
    assert "inside the output" in capsys.readouterr().err
    assert os.listdir(stores / "old.zarr") == [] and not leftovers(stores)


@pytest.mark.parametrize("argv", [["svd", "{d}/a.zarr", "-k", "3", "-o", "{d}/out"],
                                  ["eigs", "{d}/s.zarr", "-k", "3", "-o", "{d}/out"],
                                  ["solve", "{d}/s.zarr", "{d}/b.zarr", "-o", "{d}/out", "--lambda", "gcv"]])
def test_plot_never_replaces_what_blocklin_did_not_write(stores, argv, capsys):
    """``--plot`` onto an existing file had overwritten it (exit 0, no ``--overwrite`` asked), and onto a
    link had written through it: ``--plot link.png`` pointing at the input ``a.npy`` destroyed the data.
    An extension matplotlib cannot write had failed after the run (exit 1, the result written), and a
    path without one had been written as PATH.png. All are refused before the run now; a plot blocklin
    wrote is replaced with ``--overwrite`` only."""
    base = [a.format(d=stores) for a in argv]
    user = stores / "user.png"
    user.write_bytes(b"not blocklin's")
    (stores / "link.png").symlink_to(stores / "a.npy")
    data = (stores / "a.npy").read_bytes()
    for target in ("user.png", "link.png"):
        for extra in ([], ["--overwrite"]):
            assert main(base + ["--plot", str(stores / target), *extra]) == 1
            line = capsys.readouterr().err.strip().splitlines()[-1]
            assert "OutputExistsError: --plot:" in line and target in line and "Fix: " in line, line
    assert user.read_bytes() == b"not blocklin's" and (stores / "a.npy").read_bytes() == data
    for bad in ("s.txt", "s"):
        line = _usage_error(base + ["--plot", str(stores / bad)], capsys)
        assert "argument --plot: must end in an image format's extension" in line and ".png" in line, line
    assert not (stores / "out").exists() and not (stores / "s.png").exists() and not leftovers(stores)
    png = stores / "fig.png"
    assert main(base + ["--plot", str(png)]) == 0 and png.read_bytes()[:4] == b"\x89PNG"
    other = [a.format(d=stores).replace("/out", "/out2") for a in argv]
    assert main(other + ["--plot", str(png)]) == 1 and not (stores / "out2").exists()  # no --overwrite
    assert "must not exist unless overwriting is asked for" in capsys.readouterr().err
    assert main(base + ["--plot", str(png), "--overwrite"]) == 0 and png.read_bytes()[:4] == b"\x89PNG"
    assert not [p for p in os.listdir(stores) if ".partial" in p]


def test_plot_recorded_when_interrupted_once_renamed(stores, monkeypatch, capsys):
    """A Ctrl-C (or SIGTERM) landing once the plot was renamed into place, before its record was
    written, had left a complete plot without its record: the run said nothing of it, and a later
    ``--overwrite`` refused it as a file blocklin did not write. The record is written regardless now."""
    from blocklin.storage import file_records

    base = ["svd", str(stores / "a.zarr"), "-k", "3", "-o", str(stores / "out")]
    png = stores / "fig.png"
    rename = os.replace

    def interrupted_after(src, dst):
        rename(src, dst)
        if os.fspath(dst) == str(png):
            raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted_after)
    assert main(base + ["--plot", str(png)]) == 130
    said = capsys.readouterr().err.strip().splitlines()[-1]
    monkeypatch.undo()
    assert png.read_bytes()[:4] == b"\x89PNG"
    rec = file_records.read(png)
    assert rec is not None and file_records.matches(png, rec) and rec["format"] == "plot", rec
    assert "interrupted;" in said and f"{png} were written (complete)" in said, said
    assert not [p for p in os.listdir(stores) if ".partial" in p]
    assert main(base + ["--plot", str(png), "--overwrite"]) == 0 and png.read_bytes()[:4] == b"\x89PNG"


def test_plot_replaces_only_a_file_recorded_as_a_plot(stores, capsys):
    """An image format has no one signature to read, so the record tells a plot: a ``.png`` blocklin
    wrote as another kind (a raw binary export) is not one ``--overwrite`` of a plot may replace."""
    from blocklin.storage import file_records

    png = stores / "fig.png"
    png.write_bytes(b"\x89PNG raw export")
    file_records.write(png, "raw")
    base = ["svd", str(stores / "a.zarr"), "-k", "3", "-o", str(stores / "out"), "--plot", str(png)]
    assert main(base + ["--overwrite"]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "OutputExistsError: --plot:" in line and "blocklin wrote as raw, not as a plot" in line, line
    assert png.read_bytes() == b"\x89PNG raw export" and not (stores / "out").exists()


def test_plot_target_checked_again_at_save(stores, monkeypatch, capsys):
    """A file that appears at the ``--plot`` path during the run (another program's) had been replaced by
    the plot: the target was checked before the run only. It is checked again as the plot is renamed
    into place (as every file output's commit does), and kept."""
    from matplotlib.figure import Figure

    base = ["svd", str(stores / "a.zarr"), "-k", "3", "-o", str(stores / "out")]
    png = stores / "fig.png"
    savefig = Figure.savefig

    def someone_writes_first(fig, *args, **kwargs):
        png.write_bytes(b"another program's")
        return savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", someone_writes_first)
    for extra in ([], ["--overwrite"]):  # (the second run replaces the first's out, which is blocklin's)
        if png.exists():
            png.unlink()
        assert main(base + ["--plot", str(png), *extra]) == 1
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert "OutputExistsError: --plot:" in line and "fig.png" in line and "Fix: " in line, line
        assert png.read_bytes() == b"another program's"
        assert not [p for p in os.listdir(stores) if ".partial" in p or p.startswith(".fig.png")]


@pytest.mark.parametrize("argv, twice", [
    (["gemm", "{d}/a.zarr", "{d}/a.zarr", "--trans-a", "-o", "{d}/out.zarr", "-o", "{d}/other.zarr"], "-o/--out"),
    (["gemm", "{d}/a.zarr", "{d}/a.zarr", "--trans-a", "-o", "{d}/out.zarr", "--out={d}/other.zarr"], "-o/--out"),
    (["svd", "{d}/a.zarr", "-k", "2", "-k", "3", "-o", "{d}/out"], "-k"),
    (["factor", "cholesky", "{d}/s.zarr", "-o", "{d}/out.zarr", "--tile", "8", "--tile", "16"], "--tile"),
])
def test_a_single_valued_option_given_twice_is_refused(stores, argv, twice, capsys):
    """argparse keeps the last of ``-o C -o D`` and drops the first without a word; a usage error now."""
    line = _usage_error([a.format(d=stores) for a in argv], capsys)
    assert f"argument {twice}: given twice" in line and "Fix: pass it once" in line, line
    assert not {"out", "out.zarr", "other.zarr"} & set(os.listdir(stores))


def test_repeatable_options_and_flags_stay_repeatable(stores, capsys):
    assert main(["gemm", str(stores / "a.zarr"), str(stores / "a.zarr"), "--trans-a", "-o", str(stores / "o.zarr"),
                 "--storage-option", "a=1", "--storage-option", "b=2", "--no-progress", "--no-progress",
                 "--explain"]) == 0


def test_temp_dir_that_is_a_file_is_refused(stores, capsys):
    """``--temp-dir FILE`` had been accepted; a run that needed no intermediates exited 0 without a word."""
    (stores / "f.txt").write_text("mine")
    line = _usage_error(["svd", str(stores / "a.zarr"), "-k", "2", "-o", str(stores / "out"),
                         "--temp-dir", str(stores / "f.txt")], capsys)
    assert "argument --temp-dir: must be a folder" in line and "Fix: pass --temp-dir " in line, line
    assert (stores / "f.txt").read_text() == "mine" and not (stores / "out").exists()
