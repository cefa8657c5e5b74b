"""blocklin.append: rows added to a stored matrix atomically, its versions, interrupted appends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import blocklin as bl
from blocklin.cli.main import main
from blocklin.errors import BudgetError, DTypeError, ParameterError, ShapeError
from blocklin.storage.append import JOURNAL


@pytest.fixture
def base(tmp_path):
    a = np.random.default_rng(0).standard_normal((1000, 30))
    bl.from_array(a, tmp_path / "A.zarr", chunks=(128, 30))
    return a, tmp_path / "A.zarr"


def _versions(path):
    return json.load(open(os.path.join(path, "zarr.json")))["attributes"]["blocklin_versions"]


@pytest.mark.parametrize("kind", ["numpy", "npy", "zarr", "matrix", "dask", "csv"])
def test_append_every_kind_of_source(tmp_path, base, kind):
    a, path = base
    rows = np.random.default_rng(1).standard_normal((301, 30))
    if kind == "npy":
        np.save(tmp_path / "r.npy", rows)
        src = str(tmp_path / "r.npy")
    elif kind == "zarr":
        src = bl.from_array(rows, tmp_path / "r.zarr", chunks=(50, 7)).path
    elif kind == "matrix":  # read by panels through its location, never loaded whole
        src = bl.from_array(rows, tmp_path / "r.zarr", chunks=(64, 30))
    elif kind == "dask":
        import dask.array as da

        src = da.from_array(rows, chunks=(40, 30))
    elif kind == "csv":
        np.savetxt(tmp_path / "r.csv", rows, delimiter=",", fmt="%.17g")
        src = str(tmp_path / "r.csv")
    else:
        src = rows
    m = bl.append(path, src, memory="256KiB")  # panels of a few chunk bands: the band of the old last rows too
    assert m.shape == (1301, 30) and m.report["rows_added"] == 301 and m.report["version"] == 1
    assert np.array_equal(m.to_numpy(), np.vstack([a, rows]))
    v = _versions(path)
    assert [x["rows"] for x in v] == [1000, 1301] and v[1]["added"] == 301
    assert not os.path.exists(path / JOURNAL)


def test_append_casts_without_loss_and_refuses_the_rest(tmp_path, base):
    a, path = base
    ints = np.arange(60).reshape(2, 30)
    m = bl.append(path, ints)
    assert np.array_equal(m[1000:], ints.astype(np.float64))
    assert np.array_equal(bl.append(path, np.ones(30, dtype=np.float32))[1002], np.ones(30))  # one row
    f32 = bl.from_array(np.ones((4, 3), np.float32), tmp_path / "f.zarr")
    with pytest.raises(DTypeError, match="without loss.*float64"):
        bl.append(f32, np.ones((1, 3)))
    with pytest.raises(ShapeError, match="must have the matrix's 30 columns.*5 x 29"):
        bl.append(path, np.ones((5, 29)))
    with pytest.raises(DTypeError, match="numbers"):
        bl.append(path, np.array([[object()] * 30]))
    with pytest.raises(ParameterError, match="finite.*row 1, column 2"):
        bad = np.ones((3, 30))
        bad[1, 2] = np.nan
        bl.append(path, bad, nan="error")
    assert bl.open(path).shape == (1003, 30)  # nothing of the refused appends stayed
    with pytest.raises(BudgetError, match="memory='") as e:
        bl.append(path, np.ones((3, 30)), memory="1KiB")
    assert e.value.minimum == 128 * 30 * 8 * 3


def test_append_refuses_data_blocklin_did_not_write(tmp_path):
    import zarr

    zarr.create_array(str(tmp_path / "z.zarr"), shape=(4, 3), chunks=(2, 3), dtype="f8")[:] = 1.0
    before = sorted(os.listdir(tmp_path / "z.zarr"))
    with pytest.raises(ParameterError, match="blocklin wrote.*convert A.zarr A2.zarr"):
        bl.append(tmp_path / "z.zarr", np.ones((2, 3)))
    assert sorted(os.listdir(tmp_path / "z.zarr")) == before
    with pytest.raises(ParameterError, match="must not be the matrix appended to"):
        m = bl.from_array(np.ones((4, 3)), tmp_path / "s.zarr")
        bl.append(m, m.path)


def test_readers_see_the_old_or_the_new_matrix(tmp_path, base, monkeypatch):
    """A reader during an append finds the old rows (shape unchanged until the commit), then all."""
    import blocklin.storage.append as ap

    a, path = base
    rows = np.random.default_rng(2).standard_normal((700, 30))
    new = np.vstack([a, rows])
    real = ap.write_block
    seen, stop = [], threading.Event()

    def slow(*args, **kw):
        real(*args, **kw)
        stop.wait(0.02)

    monkeypatch.setattr(ap, "write_block", slow)

    def read():
        while not stop.is_set():
            x = bl.open(path).to_numpy()
            seen.append(x.shape[0])
            assert np.array_equal(x, a) or np.array_equal(x, new)

    t = threading.Thread(target=read)
    t.start()
    try:
        bl.append(path, rows, memory="128KiB")
    finally:
        stop.set()
        t.join()
    assert 1000 in seen and np.array_equal(bl.open(path).to_numpy(), new)


_KILL = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    import blocklin.storage.append as ap
    real, count = ap.write_block, [0]
    def killed(*args, **kw):
        real(*args, **kw)
        count[0] += 1
        if count[0] == 2:
            os.kill(os.getpid(), signal.SIGKILL)
    ap.write_block = killed
    ap.append(sys.argv[1], sys.argv[2], memory="128KiB")
""")


def test_sigkill_mid_append_then_finish_or_roll_back(tmp_path, base):
    a, path = base
    rows = np.random.default_rng(3).standard_normal((900, 30))
    np.save(tmp_path / "r.npy", rows)
    g = bl.gram(path, tmp_path / "G.zarr")  # a result of the old version, updatable throughout

    def kill():
        p = subprocess.run([sys.executable, "-c", _KILL, str(path), str(tmp_path / "r.npy")], cwd=tmp_path)
        assert p.returncode == -9
        assert bl.open(path).shape == (1000, 30) and np.array_equal(bl.open(path).to_numpy(), a)
        assert os.path.exists(path / JOURNAL)

    kill()
    with pytest.raises(ParameterError, match="interrupted append of stored rows, which rows given in memory cannot "
                                             "finish.*run the append of that stored source again.*--rollback"):
        bl.append(path, rows)  # the same rows, in memory: nothing matches them with the stored source
    with pytest.raises(ParameterError, match="interrupted append of other rows.*--rollback"):
        bl.append(path, bl.from_array(rows[:5], tmp_path / "r5.zarr"))  # other stored rows
    m = bl.append(path, str(tmp_path / "r.npy"))  # the same append again finishes it
    assert np.array_equal(m.to_numpy(), np.vstack([a, rows])) and not os.path.exists(path / JOURNAL)

    kill_path = tmp_path / "B.zarr"
    bl.from_array(a, kill_path, chunks=(128, 30))
    g = bl.gram(kill_path, tmp_path / "GB.zarr")
    path = kill_path
    kill()
    files = sorted(os.listdir(path / "c"))
    assert main(["append", "--rollback", str(path)]) == 0
    assert sorted(os.listdir(path / "c")) == [f for f in files if int(f) < 8]  # chunk rows beyond 1000 removed
    assert np.array_equal(bl.open(path).to_numpy(), a) and not os.path.exists(path / JOURNAL)
    assert bl.update(g.path).report["current"]  # the rolled-back band holds the same rows: still current
    bl.append(path, rows[:10])
    assert bl.update(g.path).report["updated"]["rows_read"] == 10
    assert bl.rollback_append(path) == {"interrupted": False, "removed": 0, "rows": 1010}


def test_a_killed_append_of_rows_in_memory_names_the_rollback(tmp_path, base):
    """An interrupted append of an in-memory array cannot be finished (no stamp identifies its rows): the
    same array appended again had been refused as "other rows" with the fix "run that append again to
    finish it", which is refused again (found by a randomized search); the refusal names the rollback."""
    a, path = base
    rows = np.random.default_rng(3).standard_normal((900, 30))
    np.save(tmp_path / "r.npy", rows)
    script = _KILL.replace("ap.append(sys.argv[1], sys.argv[2]", "ap.append(sys.argv[1], np.load(sys.argv[2])")
    p = subprocess.run([sys.executable, "-c", script, str(path), str(tmp_path / "r.npy")], cwd=tmp_path)
    assert p.returncode == -9 and os.path.exists(path / JOURNAL)
    with pytest.raises(ParameterError, match=r"^a: must not hold an interrupted append; one of rows given in memory "
                                             r"cannot be finished.*Fix: roll it back first: blocklin append --rollback") as err:
        bl.append(path, rows)
    assert "run that append again" not in str(err.value)
    assert bl.rollback_append(path)["interrupted"]
    assert np.array_equal(bl.append(path, rows).to_numpy(), np.vstack([a, rows]))


@pytest.mark.parametrize("then", ["finish", "rollback"])
@pytest.mark.parametrize("row", [0, 999])  # a chunk the append never writes; the band it rewrites
def test_rows_rewritten_while_an_append_was_interrupted_are_recorded(tmp_path, base, then, row):
    """Old rows changed between a killed append and its finish or rollback: the history records a
    rewrite, so a result of the old rows is refused, not updated (it had been returned as current after
    the rollback, and updated from the appended rows alone after the finish: off by the rewrite)."""
    import zarr

    a, path = base
    rows = np.random.default_rng(3).standard_normal((900, 30))
    np.save(tmp_path / "r.npy", rows)
    g = bl.gram(path, tmp_path / "G.zarr")
    p = subprocess.run([sys.executable, "-c", _KILL, str(path), str(tmp_path / "r.npy")], cwd=tmp_path)
    assert p.returncode == -9 and os.path.exists(path / JOURNAL)
    zarr.open_array(str(path), mode="r+")[row, 0] = 5.0  # in place, while the journal is there
    if then == "finish":
        assert bl.append(path, str(tmp_path / "r.npy")).shape == (1900, 30)
    else:
        assert bl.rollback_append(path)["interrupted"]
    assert _versions(path)[-1 if then == "rollback" else -2].get("rewritten") is True
    with pytest.raises(ParameterError, match="rewritten after the result"):
        bl.update(g.path)


def test_rows_of_unknown_count_are_refused_by_name(base):
    """A Dask array filtered by value has NaN rows until computed: refused naming the fix (it had raised
    ValueError: cannot convert float NaN to integer)."""
    import dask.array as da

    a, path = base
    x = da.from_array(np.random.default_rng(4).standard_normal((40, 30)), chunks=(10, 30))
    x = x[x[:, 0] > 0]
    with pytest.raises(ShapeError, match="rows: must have a known shape.*compute_chunk_sizes"):
        bl.append(path, x)
    assert bl.append(path, x.compute_chunk_sizes()).shape[0] == 1000 + int((x[:, 0] > 0).sum().compute())
    assert np.array_equal(bl.open(path).to_numpy()[:1000], a)


def test_a_rewrite_between_appends_is_recorded(tmp_path, base):
    a, path = base
    g = bl.gram(path, tmp_path / "G.zarr")
    bl.append(path, np.ones((3, 30)))
    import zarr

    z = zarr.open_array(str(path), mode="r+")
    z[0, 0] = 5.0  # rows rewritten in place, not by an append
    bl.append(path, np.ones((3, 30)))
    assert _versions(path)[2].get("rewritten") is True
    with pytest.raises(ParameterError, match="rewritten after the result"):
        bl.update(g.path)


def test_appends_to_one_matrix_take_turns(tmp_path, base):
    """Two appends at once from two threads: both land, one after the other, nothing mixed."""
    a, path = base
    rows = [np.full((200, 30), float(i)) for i in (1, 2)]
    threads = [threading.Thread(target=bl.append, args=(path, r)) for r in rows]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = bl.open(path).to_numpy()
    assert got.shape == (1400, 30) and np.array_equal(got[:1000], a)
    tail = got[1000:]
    assert {float(tail[0, 0]), float(tail[200, 0])} == {1.0, 2.0}
    assert np.array_equal(tail[:200], np.full((200, 30), tail[0, 0])) and len(_versions(path)) == 3


def test_cli_append_and_update(tmp_path, base, capsys):
    a, path = base
    rows = np.random.default_rng(4).standard_normal((50, 30))
    np.save(tmp_path / "r.npy", rows)
    assert main(["gram", str(path), "-o", str(tmp_path / "G.zarr")]) == 0
    capsys.readouterr()
    assert main(["append", str(path), str(tmp_path / "r.npy"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["shape"] == [1050, 30] and out["rows_added"] == 50 and out["version"] == 1
    assert main(["info", str(tmp_path / "G.zarr")]) == 0
    assert f"current      no ({path}: 1000 rows then, 1050 now); blocklin update {tmp_path / 'G.zarr'}" in \
        capsys.readouterr().out
    assert main(["info", str(path)]) == 0
    assert "versions     2 (1000 -> 1050 rows" in capsys.readouterr().out
    assert main(["update", str(tmp_path / "G.zarr")]) == 0
    assert "rows 1000:1050" in capsys.readouterr().out
    assert main(["info", str(tmp_path / "G.zarr"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["current"]["current"] is True
    assert main(["update", str(tmp_path / "G.zarr")]) == 0
    assert "up to date" in capsys.readouterr().out
    assert main(["append", str(path)]) == 1
    assert "NEW" in capsys.readouterr().err


def test_appending_no_rows_reports_it(tmp_path, capsys):
    """An empty batch leaves the matrix as it is and says so: the command line had ended in a traceback
    (``KeyError: 'rows_before'``; found by a randomized search)."""
    m = bl.from_array(np.ones((4, 3)), tmp_path / "X.zarr")
    np.save(tmp_path / "e.npy", np.ones((0, 3)))
    got = bl.append(m, np.ones((0, 3)))
    assert got.report["rows_added"] == 0 and got.report["rows_before"] == 4 and got.shape == (4, 3)
    assert main(["append", str(tmp_path / "X.zarr"), str(tmp_path / "e.npy"), "--no-progress"]) == 0
    assert "appended 0 rows" in capsys.readouterr().out
    np.testing.assert_array_equal(bl.open(tmp_path / "X.zarr").to_numpy(), np.ones((4, 3)))


@pytest.mark.parametrize("dtype, value, rows_dtype", [("float64", 2 ** 53 + 1, np.int64), ("float32", 2 ** 24 + 1, np.int32),
                                                      ("float64", 2 ** 64 - 1, np.uint64)])
def test_integers_a_float_matrix_cannot_hold_are_refused(tmp_path, dtype, value, rows_dtype):
    """Integers beyond the float's ``2^(p+1)`` that it rounds are refused, naming the first, and the matrix
    is left as it was; they had been rounded silently (NumPy calls int64 to float64 "safe"). The fix
    names a wider dtype only where there is one (a float64 matrix had been told to use float64). Exactly
    representable large integers (``2^60``) are taken."""
    m = bl.from_array(np.zeros((2, 3), dtype=dtype), tmp_path / "X.zarr")
    rows = np.ones((70, 3), dtype=rows_dtype)
    rows[65, 2] = value
    with pytest.raises(DTypeError, match=rf"rows: must convert to the matrix's {dtype} without loss; got {value} at "
                                          r"row 65, column 2"):
        bl.append(m, rows)
    with pytest.raises(DTypeError) as info:  # the fix names a dtype wider than the matrix's, or none
        bl.append(m, rows)
    fix = str(info.value).split("Fix: ")[1]
    assert ("a wider dtype (float64)" if dtype == "float32" else "keep such integers in an integer matrix") in fix, fix
    np.testing.assert_array_equal(bl.open(tmp_path / "X.zarr").to_numpy(), np.zeros((2, 3)))
    big = 2 ** 60 if np.dtype(rows_dtype).itemsize == 8 else 2 ** 30  # beyond 2^(p+1), yet exact
    exact = np.array([[big, big if rows_dtype == np.uint64 else -big, 1]], dtype=rows_dtype)
    got = bl.append(m, exact)
    np.testing.assert_array_equal(got.to_numpy()[-1], exact[0].astype(dtype))


def test_append_refuses_results_computed_from_other_matrices(tmp_path, base, capsys):
    """Rows appended to a Gram had made a non-square "Gram" (6 x 5) that ``update`` then called current; a
    result (a Gram, a product, a solution, a factor, an inverse, an SVD's factors) is refused by its
    record, naming the result and the fixes (append to its inputs and update, or copy it first), and is
    left unchanged; data (from_array, convert, random, a copy of a result) takes rows."""
    a, path = base
    rng = np.random.default_rng(3)
    b = bl.from_array(rng.standard_normal((1000, 2)), tmp_path / "B.zarr").path
    results = {
        "gram": bl.gram(path, tmp_path / "G.zarr").path,
        "matmul": bl.matmul(path, b, tmp_path / "AB.zarr", trans_a=True).path,
        "solve": bl.solve(path, b, out=tmp_path / "x.zarr").path,
        "qr": bl.qr(path, out=tmp_path / "R.zarr", mode="r").path,
        "inv": bl.inv(np.eye(4) * 2.0, out=tmp_path / "I.zarr").path,
    }
    bl.svd(path, k=2, out=tmp_path / "S.zarr")
    results["svd"] = tmp_path / "S.zarr" / "Vt"
    for op, p in results.items():
        before = bl.open(p).to_numpy()
        with pytest.raises(ParameterError, match=rf"^a: must be data .*no longer the {op} of its inputs.*; got "
                                                 rf"'[^']*', (a result of {op} \(\d+ x \d+\)|the member 'Vt' of a "
                                                 rf"result of svd)\. Fix: append the rows to its inputs.*blocklin "
                                                 r"update.*blocklin convert"):
            bl.append(p, np.ones((1, before.shape[1])))
        after = bl.open(p)
        assert after.shape == before.shape and np.array_equal(after.to_numpy(), before)
    assert main(["append", str(results["gram"]), str(tmp_path / "A.zarr")]) != 0  # the CLI says the same
    assert "no longer the gram of its inputs" in capsys.readouterr().err
    assert bl.update(results["gram"]).shape == (30, 30)
    bl.convert(results["gram"], tmp_path / "G2.zarr")  # a copy is data of its own
    assert bl.append(tmp_path / "G2.zarr", np.ones((1, 30))).shape == (31, 30)
    assert bl.append(bl.random(tmp_path / "r.zarr", (10, 30)).path, np.ones((2, 30))).shape == (12, 30)
