"""The suggested fix must work: budgets a refusal names suffice (and do not move between retries),
headers that lie say "truncated", and raw OS errors name the path, the setting and the fix."""

from __future__ import annotations

import io
import re
import zipfile

import numpy as np
import pytest
import scipy.io
import scipy.sparse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import blocklin
from blocklin.errors import BlocklinError, BudgetError, FormatError
from support.hostile import assert_refused, leftovers, run_many, small_tmpfs, write_zarr

_SUGGESTED = re.compile(r"memory[= ]'?(\d+[KMG]iB)")


def _suggestion(exc: BaseException) -> str:
    found = _SUGGESTED.search(str(exc))
    assert found, str(exc)
    return found.group(1)


def _retry(call, budgets: list[str]) -> str:
    """Every failing budget names the same suggestion, and the call succeeds with it."""
    named = set()
    for budget in budgets:
        with pytest.raises(BudgetError) as info:
            call(budget)
        named.add(_suggestion(info.value))
    assert len(named) == 1, named
    (hint,) = named
    call(hint)
    return hint


@pytest.mark.parametrize("method", ["sketch", "rsvd"])
def test_svd_budget_suggestions_suffice(tmp_path, method):
    a = np.random.default_rng(0).standard_normal((1200, 80))
    write_zarr(tmp_path / "a.zarr", a, (150, 80))
    runs = iter(range(10))

    def call(memory):
        return blocklin.svd(str(tmp_path / "a.zarr"), 4, method=method, memory=memory, seed=0, power_iters=1,
                            out=tmp_path / f"u{next(runs)}")

    _retry(call, ["16KiB", "100KiB"])  # both below the minimum of either method
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("name", ["c.csv", "zc.npz:x", "arr.mtx", "coo.mtx"])
def test_reader_budget_suggestions_suffice(tmp_path, name):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((1500, 30))
    np.savetxt(tmp_path / "c.csv", a, delimiter=",")
    np.savez_compressed(tmp_path / "zc.npz", x=a)
    scipy.io.mmwrite(str(tmp_path / "arr.mtx"), a)
    scipy.io.mmwrite(str(tmp_path / "coo.mtx"), scipy.sparse.random(1500, 1500, density=0.01, random_state=0))
    runs = iter(range(10))

    def call(memory):
        return blocklin.convert(str(tmp_path / name), str(tmp_path / f"o{next(runs)}.zarr"), memory=memory)

    _retry(call, ["8KiB", "600KiB"])
    assert leftovers(tmp_path) == []


def test_headers_that_lie_say_truncated(tmp_path):
    (tmp_path / "coo.mtx").write_text("%%MatrixMarket matrix coordinate real general\n1000 1000 1000000000000\n"
                                      "1 1 1.0\n5 5 2.0\n")
    (tmp_path / "arr.mtx").write_text("%%MatrixMarket matrix array real general\n1000000 1000000\n1.0\n2.0\n")
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f8", "fortran_order": False, "shape": (10**6, 10**6)})
    (tmp_path / "big.npy").write_bytes(buf.getvalue() + np.arange(10.0).tobytes())
    with zipfile.ZipFile(tmp_path / "big.npz", "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("x.npy", (tmp_path / "big.npy").read_bytes())
    for name in ("coo.mtx", "arr.mtx", "big.npy", "big.npz:x"):
        with pytest.raises(FormatError, match="truncated"):
            blocklin.convert(str(tmp_path / name), str(tmp_path / "o.zarr"), memory="64MiB")
    assert leftovers(tmp_path) == [] and not (tmp_path / "o.zarr").exists()


def test_os_errors_name_the_path_the_setting_and_the_fix(tmp_path):
    a = np.random.default_rng(3).standard_normal((1200, 1200)) + 1200 * np.eye(1200)
    write_zarr(tmp_path / "a.zarr", a, (300, 300))
    write_zarr(tmp_path / "s.zarr", a[:64, :64], (32, 32))
    write_zarr(tmp_path / "t.zarr", a[:, :20].copy(), (300, 20))  # streamed by svd at 200KiB
    (tmp_path / "afile").write_text("not a folder")
    with small_tmpfs(tmp_path / "full", "20m"), small_tmpfs(tmp_path / "ro", "1m", read_only=True):
        cases = [
            # the inverse's work stores (about 3.5 n^2 = 38 MiB) cannot fit 20 MiB: refused up front
            (["inv", "a.zarr", "-o", "x.zarr", "--memory", "4MiB"], {"BLOCKLIN_TEMP_DIR": str(tmp_path / "full")},
             "DiskSpaceError", ["temp data in the temp dir", str(tmp_path / "full"), "BLOCKLIN_TEMP_DIR"]),
            (["gemm", "s.zarr", "s.zarr", "-o", "ro/c.zarr"], None, "DiskSpaceError",
             ["must be writable", "read-only", str(tmp_path / "ro")]),
            (["svd", "t.zarr", "-k", "2", "-o", "u", "--memory", "200KiB"], {"BLOCKLIN_TEMP_DIR": str(tmp_path / "ro")},
             "DiskSpaceError", ["temp dir", "BLOCKLIN_TEMP_DIR"]),
            (["svd", "t.zarr", "-k", "2", "-o", "v", "--memory", "200KiB"], {"BLOCKLIN_TEMP_DIR": str(tmp_path / "afile")},
             "TempDirError", ["BLOCKLIN_TEMP_DIR", "afile"]),
        ]
        for args, env, error, patterns in cases:
            (proc,) = run_many([args], tmp_path, env)
            assert proc.returncode == 1, (args, proc.stdout)
            assert_refused(proc, error, *patterns)
        assert leftovers(tmp_path, tmp_path / "full", tmp_path / "tmp") == []


def test_a_disk_that_fills_during_the_run_is_named(tmp_path, monkeypatch, capsys):
    """Space checked up front can still run out (another program fills the disk): the raw OSError of
    the write becomes one line naming the path, the setting and the fix, and nothing is left."""
    import shutil

    from blocklin.cli.main import main
    from blocklin.storage import space

    a = np.random.default_rng(3).standard_normal((1200, 1200)) + 1200 * np.eye(1200)
    write_zarr(tmp_path / "a.zarr", a, (300, 300))
    full = tmp_path / "full"
    with small_tmpfs(full, "20m"):
        real = shutil.disk_usage  # the up-front check sees room that is gone by the time of the writes
        monkeypatch.setattr(space.shutil, "disk_usage", lambda p: real(p)._replace(free=1 << 40))
        rc = main(["inv", str(tmp_path / "a.zarr"), "-o", str(full / "x.zarr"), "--memory", "4MiB",
                   "--temp-dir", str(full), "--no-progress"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 1 and len(err) == 1, err
        assert "no space left" in err[0] and str(full) in err[0] and "Fix: free space" in err[0], err
        assert leftovers(tmp_path, full) == []


def test_a_malformed_blocklin_memory_only_breaks_commands_without_memory(tmp_path):
    write_zarr(tmp_path / "s.zarr", np.eye(8), (8, 8))
    env = {"BLOCKLIN_MEMORY": "lots"}
    ok, bad = run_many([["gemm", "s.zarr", "s.zarr", "-o", "c.zarr", "--memory", "64MiB"],
                        ["gemm", "s.zarr", "s.zarr", "-o", "d.zarr"]], tmp_path, env)
    assert ok.returncode == 0, ok.stderr
    np.testing.assert_array_equal(blocklin.open(str(tmp_path / "c.zarr")).to_numpy(), np.eye(8))
    assert_refused(bad, "ConfigError", "BLOCKLIN_MEMORY", "'lots'", "--memory")


# -- a fuzzer of headers: a reader either reads what the file holds or refuses with a BlocklinError ----

@settings(derandomize=True, max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(m=st.integers(0, 10**12), n=st.integers(0, 10**12), nnz=st.integers(0, 10**15),
       layout=st.sampled_from(["coordinate", "array"]), entries=st.integers(0, 4))
def test_fuzzed_matrix_market_size_lines(tmp_path_factory, m, n, nnz, layout, entries):
    folder = tmp_path_factory.mktemp("mm")
    body = "".join(f"{i + 1} {i + 1} {i + 1}.5\n" for i in range(entries)) if layout == "coordinate" else \
        "".join(f"{i + 1}.5\n" for i in range(entries))
    size = f"{m} {n} {nnz}" if layout == "coordinate" else f"{m} {n}"
    path = folder / "f.mtx"
    path.write_text(f"%%MatrixMarket matrix {layout} real general\n{size}\n{body}")
    try:
        report = blocklin.convert(str(path), str(folder / "o.zarr"), memory="64MiB")
    except BlocklinError as exc:
        if (layout == "coordinate" and nnz > entries + 1) or (layout == "array" and m * n > entries + 1):
            assert "truncated" in str(exc) or "must fit the free space" in str(exc), str(exc)
        return
    got = blocklin.open(report["output"]).to_numpy()
    # the reference is built here (scipy's reader crashes on some degenerate size lines)
    if layout == "array":
        expected = (np.arange(entries) + 1.5).reshape(n, m).T
    else:
        expected = np.zeros((m, n))
        expected[np.arange(nnz), np.arange(nnz)] = np.arange(nnz) + 1.5
    np.testing.assert_array_equal(got, expected)


@settings(derandomize=True, max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(shape=st.tuples(st.integers(0, 10**7), st.integers(0, 10**7)), stored=st.integers(0, 40))
def test_fuzzed_npy_headers(tmp_path_factory, shape, stored):
    folder = tmp_path_factory.mktemp("npy")
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f8", "fortran_order": False, "shape": shape})
    data = np.arange(float(stored))
    (folder / "f.npy").write_bytes(buf.getvalue() + data.tobytes())
    try:
        report = blocklin.convert(str(folder / "f.npy"), str(folder / "o.zarr"), memory="64MiB")
    except FormatError as exc:
        assert shape[0] * shape[1] != stored, str(exc)
        assert "truncated" in str(exc) or "does not match" in str(exc) or "size" in str(exc), str(exc)
        return
    assert shape[0] * shape[1] == stored
    np.testing.assert_array_equal(blocklin.open(report["output"]).to_numpy(), data.reshape(shape))
