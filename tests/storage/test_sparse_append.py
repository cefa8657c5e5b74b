"""blocklin.append to a stored sparse matrix (a blocklin-csr group): the CSR arrays extended atomically,
against ``from_sparse`` of ``scipy.sparse.vstack``; dtype rules, killed appends, versions, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import scipy.io
import scipy.sparse
import zarr

import blocklin as bl
from blocklin.cli.main import main
from blocklin.errors import DTypeError, ParameterError, ShapeError
from blocklin.storage.append_journal import JOURNAL

ARRAYS = ("indptr", "indices", "data")


def _old(tmp_path, dtype=np.float64):
    x = scipy.sparse.random(2500, 60, density=0.02, random_state=0, format="csr", dtype=dtype)
    bl.from_sparse(x, tmp_path / "S.zarr", memory="64MiB")
    return x.tocsr(), tmp_path / "S.zarr"


def _new(p=77, seed=1, density=0.2, dtype=np.float64):
    return scipy.sparse.random(p, 60, density=density, random_state=seed, format="csr", dtype=dtype)


def _same_bits(path, want, tmp_path):
    """The stored CSR arrays hold the bits of a fresh ``from_sparse`` of ``want`` (the layout of values,
    column indices and row offsets is deterministic; the row blocks are not: they follow the budgets)."""
    ref = tmp_path / "ref.zarr"
    bl.from_sparse(want, ref, memory="64MiB", overwrite=True)
    s = bl.open(path)
    assert s.shape == want.shape and s.nnz == want.nnz and s.dtype == want.dtype
    got, exp = zarr.open_group(str(path), mode="r"), zarr.open_group(str(ref), mode="r")
    for k in ARRAYS:
        a, b = got[k][:], exp[k][:]
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), k
    rb = s.row_blocks
    assert rb[0] == 0 and rb[-1] == want.shape[0] and np.all(np.diff(rb) > 0)
    assert (s.to_scipy() != want).nnz == 0


def _versions(path):
    return json.load(open(os.path.join(path, "zarr.json")))["attributes"]["blocklin_versions"]


@pytest.mark.parametrize("kind", ["scipy", "coo_duplicates", "numpy", "mtx", "npz", "group", "hdf5"])
def test_append_every_kind_of_source(tmp_path, kind):
    old, path = _old(tmp_path)
    new = _new()
    if kind == "scipy":
        rows = new
    elif kind == "coo_duplicates":  # entries repeated: summed, as from_sparse sums them
        c = new.tocoo()
        rows = scipy.sparse.coo_matrix((np.r_[c.data, c.data[:5]], (np.r_[c.row, c.row[:5]], np.r_[c.col, c.col[:5]])),
                                       shape=new.shape)
        new = rows.tocsr()
    elif kind == "numpy":
        rows = new.toarray()
    elif kind == "mtx":
        scipy.io.mmwrite(tmp_path / "new.mtx", new)
        rows = str(tmp_path / "new.mtx")
    elif kind == "npz":
        scipy.sparse.save_npz(tmp_path / "new.npz", new)
        rows = str(tmp_path / "new.npz")
    elif kind == "group":
        rows = bl.from_sparse(new, tmp_path / "N.zarr")
    else:
        import h5py

        with h5py.File(tmp_path / "new.h5", "w") as f:
            g = f.create_group("X")
            g.attrs.update({"encoding-type": "csr_matrix", "encoding-version": "0.1.0", "shape": new.shape})
            for name in ("data", "indices", "indptr"):
                g[name] = getattr(new, name)
        rows = f"{tmp_path / 'new.h5'}:/X"
    m = bl.append(path, rows, memory="64MiB")
    assert m.shape == (2577, 60) and m.report["rows_added"] == 77 and m.report["nnz_added"] == new.nnz
    want = scipy.sparse.vstack([old, new]).tocsr()
    _same_bits(path, want, tmp_path)
    assert [v["rows"] for v in _versions(path)] == [2500, 2577]
    assert not os.path.exists(path / JOURNAL)
    work = tmp_path / "blocklin-tmp"
    assert not os.path.isdir(work) or not [f for f in os.listdir(work) if f.startswith("blocklin-append")]


def test_appends_in_a_row_and_small_strips(tmp_path):
    """Appends that start inside a chunk of every array (the chunk rewritten with its old bytes), strips
    of a small budget (several row blocks), float32 and int rows cast to the matrix's float64."""
    old, path = _old(tmp_path)
    parts = [old]
    for seed, p in ((1, 300), (2, 1), (3, 4000)):
        new = _new(p, seed, density=0.3)
        bl.append(path, new, memory="16MiB")
        parts.append(new)
    ints = scipy.sparse.csr_matrix(np.arange(120, dtype=np.int32).reshape(2, 60) - 50)
    f32 = _new(3, 9, dtype=np.float32)
    bl.append(path, ints)
    bl.append(path, f32)
    want = scipy.sparse.vstack(parts + [ints.astype(np.float64), f32.astype(np.float64)]).tocsr()
    _same_bits(path, want, tmp_path)
    assert [v["rows"] for v in _versions(path)] == [2500, 2800, 2801, 6801, 6803, 6806]
    np.testing.assert_array_equal(bl.open(path).rows(6801, 6803).toarray(), ints.toarray())


def test_small_budget_writes_several_row_blocks(tmp_path):
    old, path = _old(tmp_path)
    new = _new(3000, 4, density=0.5)  # 90 000 entries: more than one strip of a 4 MiB budget
    m = bl.append(path, bl.from_sparse(new, tmp_path / "N.zarr"), memory="4MiB")  # a group: read in strips
    assert m.report["row_blocks_added"] > 1 and m.n_blocks == 1 + m.report["row_blocks_added"]
    _same_bits(path, scipy.sparse.vstack([old, new]).tocsr(), tmp_path)


def test_append_refuses_what_would_lose_or_mismatch(tmp_path):
    old, path = _old(tmp_path, np.float32)
    files = {f: os.stat(os.path.join(r, f)).st_mtime_ns for r, _, fs in os.walk(path) for f in fs}
    with pytest.raises(ShapeError, match="must have the matrix's 60 columns.*3 x 59"):
        bl.append(path, scipy.sparse.random(3, 59, density=0.5, random_state=0))
    with pytest.raises(DTypeError, match="rows.*float32 without loss.*float64.*astype"):
        bl.append(path, _new(3))
    with pytest.raises(DTypeError, match="imaginary parts"):
        bl.append(path, _new(3).astype(np.complex64))
    big = scipy.sparse.csr_matrix((np.array([2**24 + 1], np.int32), np.array([7]), np.array([0, 0, 1])),
                                  shape=(2, 60))
    with pytest.raises(DTypeError, match=r"16777217 at row 1, column 7 of the rows, which float32 holds as 16777216"):
        bl.append(path, big)
    nan = _new(5).astype(np.float32).tolil()
    nan[3, 11] = np.inf
    with pytest.raises(ParameterError, match=r"rows.*finite.*inf at row 3, column 11 of the rows"):
        bl.append(path, nan.tocsr(), nan="error")
    with pytest.raises(ParameterError, match="must be sparse.*dense stored matrix"):
        bl.append(path, bl.from_array(np.ones((2, 60), np.float32), tmp_path / "D.zarr"))
    np.save(tmp_path / "d.npy", np.ones((2, 60), np.float32))
    with pytest.raises(ParameterError, match="must be sparse.*d.npy"):
        bl.append(path, str(tmp_path / "d.npy"))
    with pytest.raises(ParameterError, match="must not be the matrix appended to"):
        bl.append(path, path)
    after = {f: os.stat(os.path.join(r, f)).st_mtime_ns for r, _, fs in os.walk(path) for f in fs}
    assert after == files  # nothing written, no journal
    m = bl.append(path, nan.tocsr())  # nan="allow": stored, as convert stores it
    assert np.isinf(m.rows(2503, 2504).toarray()[0, 11])


def test_integer_duplicates_summed_beyond_their_dtype(tmp_path):
    """Integer rows' duplicate entries are summed in 64 bits, then cast to the matrix's dtype with the
    append's check: int8 ``100 + 100`` had been refused as wrapping in int8 (its fix naming a ``dtype``
    that append does not take) where a float32 matrix holds 200; an int8 matrix refuses the sum by name."""
    old, path = _old(tmp_path, np.float32)
    dup = scipy.sparse.coo_matrix((np.array([100, 100, -3], np.int8), (np.array([1, 1, 0]), np.array([2, 2, 5]))),
                                  shape=(3, 60))
    bl.append(path, dup)
    _same_bits(path, scipy.sparse.vstack([old, dup.astype(np.float32)]).tocsr(), tmp_path)
    narrow = tmp_path / "I.zarr"
    bl.from_sparse(scipy.sparse.csr_matrix(np.eye(3, 60, dtype=np.int8)), narrow)
    with pytest.raises(DTypeError, match=r"int8 without loss.*got 200 at row 1, column 2 of the rows"):
        bl.append(narrow, dup)
    assert bl.open(narrow).shape == (3, 60)


def test_a_reader_during_the_append_sees_the_old_matrix(tmp_path, monkeypatch):
    """Between the arrays' new lengths and the group's commit, the matrix read is the old one."""
    import blocklin.storage.sparse_append as sa

    old, path = _old(tmp_path)
    real, seen = sa._commit, []

    def commit(loc, attrs):
        if "nnz" in attrs and attrs["nnz"] != old.nnz:  # the append's commit, not a rollback's
            assert zarr.open_array(str(path / "data"), mode="r").shape[0] > old.nnz  # arrays extended
            s = bl.open(path)
            seen.append(s.shape)
            assert (s.to_scipy() != old).nnz == 0
        real(loc, attrs)

    monkeypatch.setattr(sa, "_commit", commit)
    bl.append(path, _new())
    assert seen == [(2500, 60)] and bl.open(path).shape == (2577, 60)


_KILL = textwrap.dedent("""
    import os, signal, sys
    import blocklin.storage.sparse_append as sa
    where = sys.argv[3]
    if where == "chunks":  # after the third chunk file of the append (the rows' own conversion done)
        real, count = sa._Extender._flush, [0]
        def killed(self, *args, **kw):
            real(self, *args, **kw)
            count[0] += 1
            if count[0] == 3:
                os.kill(os.getpid(), signal.SIGKILL)
        sa._Extender._flush = killed
    else:
        def killed(*args, **kw):
            os.kill(os.getpid(), signal.SIGKILL)
        sa._commit = killed
    import blocklin as bl
    bl.append(sys.argv[1], sys.argv[2], memory="16MiB")
""")


def test_sigkill_mid_append_then_finish_or_roll_back(tmp_path):
    """A killed append leaves the old matrix readable and its journal; the same stored rows finish it."""
    old, path = _old(tmp_path)
    new = _new(3000, 5, density=0.3)
    scipy.sparse.save_npz(tmp_path / "new.npz", new)
    p = subprocess.run([sys.executable, "-c", _KILL, str(path), str(tmp_path / "new.npz"), "chunks"], cwd=tmp_path)
    assert p.returncode == -9
    s = bl.open(path)
    assert s.shape == (2500, 60) and (s.to_scipy() != old).nnz == 0 and os.path.exists(path / JOURNAL)
    work = tmp_path / "blocklin-tmp"  # the killed process's copy of the rows: blocklin clean removes it
    assert main(["clean", str(work), "--no-progress"]) == 0 and not os.listdir(work)
    with pytest.raises(ParameterError, match="interrupted append of stored rows, which rows given in memory"):
        bl.append(path, new)
    with pytest.raises(ParameterError, match="interrupted append of other rows.*--rollback"):
        bl.append(path, bl.from_sparse(new[:5], tmp_path / "N5.zarr"))
    m = bl.append(path, str(tmp_path / "new.npz"), memory="16MiB")  # the same append again finishes it
    assert m.shape == (5500, 60) and not os.path.exists(path / JOURNAL)
    _same_bits(path, scipy.sparse.vstack([old, new]).tocsr(), tmp_path)
    assert [v["rows"] for v in _versions(path)] == [2500, 5500]


def _killed(monkeypatch, path, rows, where):
    """The state a kill leaves (chunks written; with ``where="lengths"`` the arrays' new lengths too, the
    group not committed), made in this process: the append stops there and its undo is skipped."""
    import blocklin.storage.sparse_append as sa

    class Killed(BaseException):
        pass

    def stop(*args, **kw):
        raise Killed

    if where == "chunks":
        real, count = sa._Extender._flush, [0]

        def flush(self):
            real(self)
            count[0] += 1
            if count[0] == 3:
                raise Killed

        monkeypatch.setattr(sa._Extender, "_flush", flush)
    else:
        monkeypatch.setattr(sa, "_commit", stop)
    with monkeypatch.context() as mp:
        mp.setattr(sa, "_undo", lambda *a, **k: 0)
        with pytest.raises(Killed):
            bl.append(path, rows, memory="16MiB")
    monkeypatch.undo()
    assert os.path.exists(path / JOURNAL)


@pytest.mark.parametrize("where", ["chunks", "lengths"])
def test_interrupted_append_rolled_back_or_finished(tmp_path, monkeypatch, where):
    """Interrupted after some chunks, or after the arrays' new lengths and before the commit: the old
    matrix is read; a rollback restores its arrays, the same stored rows finish the append."""
    old, path = _old(tmp_path)
    new = _new(3000, 5, density=0.3)
    scipy.sparse.save_npz(tmp_path / "new.npz", new)
    want = scipy.sparse.vstack([old, new]).tocsr()
    before = {os.path.relpath(os.path.join(r, f), path): open(os.path.join(r, f), "rb").read()
              for r, _, fs in os.walk(path) for f in fs}
    _killed(monkeypatch, path, str(tmp_path / "new.npz"), where)
    assert (bl.open(path).to_scipy() != old).nnz == 0
    if where == "lengths":
        assert zarr.open_array(str(path / "data"), mode="r").shape == (want.nnz,)  # longer than the matrix
    assert main(["append", "--rollback", str(path)]) == 0
    after = {os.path.relpath(os.path.join(r, f), path): open(os.path.join(r, f), "rb").read()
             for r, _, fs in os.walk(path) for f in fs}
    assert set(after) == set(before)  # chunk files beyond removed, no temporaries, no journal
    for k in after:  # the arrays' metadata as before (their lengths restored)
        if k.endswith("zarr.json") and k != "zarr.json":
            assert json.loads(after[k]) == json.loads(before[k]), k
    g = zarr.open_group(str(path), mode="r")
    for k in ARRAYS:  # the rewritten chunks hold the old elements' bytes (past them, the rows rolled back)
        assert g[k][:].tobytes() == getattr(old, k).astype(g[k].dtype).tobytes(), k
    assert (bl.open(path).to_scipy() != old).nnz == 0 and not _versions(path)[-1].get("rewritten")
    assert bl.rollback_append(path) == {"interrupted": False, "removed": 0, "rows": 2500}
    _killed(monkeypatch, path, str(tmp_path / "new.npz"), where)
    bl.append(path, str(tmp_path / "new.npz"))  # finished by the same rows
    _same_bits(path, want, tmp_path)
    assert [v["rows"] for v in _versions(path)] == [2500, 5500]


def test_rows_rewritten_while_an_append_was_interrupted_are_recorded(tmp_path, monkeypatch):
    old, path = _old(tmp_path)
    new = _new(3000, 5, density=0.3)
    scipy.sparse.save_npz(tmp_path / "new.npz", new)
    _killed(monkeypatch, path, str(tmp_path / "new.npz"), "chunks")
    data = zarr.open_array(str(path / "data"), mode="r+")  # an old value changed behind blocklin's back
    data[0] = 42.0
    bl.rollback_append(path)
    assert _versions(path)[-1].get("rewritten")


def test_append_no_rows_and_the_cli(tmp_path, capsys):
    old, path = _old(tmp_path)
    m = bl.append(path, scipy.sparse.csr_matrix((0, 60)))
    assert m.report["rows_added"] == 0 and m.shape == (2500, 60)
    new = _new(10, 3)
    scipy.io.mmwrite(tmp_path / "new.mtx", new)
    assert main(["append", str(path), str(tmp_path / "new.mtx")]) == 0
    assert "appended 10 rows" in capsys.readouterr().out
    assert main(["append", "--rollback", str(path)]) == 0
    assert "no interrupted append" in capsys.readouterr().out
    _same_bits(path, scipy.sparse.vstack([old, new]).tocsr(), tmp_path)
