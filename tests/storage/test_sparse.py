"""Sparse stored matrices (``blocklin-csr``): the layout, conversion by external sort, export, refusals.

Conversions do no arithmetic but duplicate sums, so results are compared exactly with SciPy's own
(``scipy.io.mmread`` / ``scipy.sparse``, canonical CSR: duplicates summed, indices sorted); where
duplicates are summed the values are integers, so every summation order gives the same bits.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import scipy.io
import scipy.sparse
import zarr

import blocklin
from blocklin.cli.main import main
from blocklin.errors import BudgetError, ConfigError, DTypeError, FormatError, NonFiniteError, ParameterError
from blocklin.sparse import SparseMatrix
from blocklin.storage.sparse import SparseWriter
from blocklin.storage.sparse_convert import ScipySource, SortPlan, external_sort
from support.hostile import leftovers


def _canonical(x) -> scipy.sparse.csr_matrix:
    c = scipy.sparse.csr_matrix(x, copy=True)
    c.sum_duplicates()
    c.sort_indices()
    return c


def _assert_same(got: scipy.sparse.csr_matrix, want) -> None:
    want = _canonical(want)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.indptr, want.indptr)
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_array_equal(got.data, want.data)


def _mtx(rows, cols, vals, shape, field="integer", symmetry="general") -> str:
    head = f"%%MatrixMarket matrix coordinate {field} {symmetry}\n% comment\n{shape[0]} {shape[1]} {len(rows)}\n"
    if field == "pattern":
        return head + "".join(f"{r} {c}\n" for r, c in zip(rows, cols))
    return head + "".join(f"{r} {c} {v}\n" for r, c, v in zip(rows, cols, vals))


def _entries(rng, m, n, k, *, lower=False, strict=False):
    r = rng.integers(1, m + 1, k)
    c = rng.integers(1, n + 1, k)
    if lower:
        r, c = np.maximum(r, c), np.minimum(r, c)
        if strict:
            keep = r != c
            r, c = r[keep], c[keep]
    v = rng.integers(-9, 10, len(r))
    return r.tolist(), c.tolist(), v.tolist()


def _nothing_left(tmp_path, *outputs):
    assert leftovers(tmp_path) == []
    for out in outputs:
        assert not (tmp_path / out).exists()


# -- every field and symmetry, unsorted input with duplicates, against scipy.io.mmread --------------

@pytest.mark.parametrize(("field", "symmetry"), [
    ("real", "general"), ("integer", "general"), ("pattern", "general"), ("integer", "symmetric"),
    ("pattern", "symmetric"), ("real", "skew-symmetric"), ("integer", "skew-symmetric"),
])
def test_mtx_round_trip_matches_scipy(tmp_path, rng, field, symmetry):
    m = n = 40
    r, c, v = _entries(rng, m, n, 600, lower=symmetry != "general", strict=symmetry == "skew-symmetric")
    if field == "real":
        v = [x / 4 for x in v]  # quarters: sums of a few are exact in any order
    text = _mtx(r, c, v, (m, n), field, symmetry)
    (tmp_path / "a.mtx").write_text(text)
    rep = blocklin.convert(tmp_path / "a.mtx", tmp_path / "a.zarr", memory="64MiB")
    assert rep["layout"] == "sparse" and rep["from"] == "mtx"
    s = blocklin.open(tmp_path / "a.zarr")
    assert isinstance(s, SparseMatrix) and s.dtype == np.float64
    want = scipy.io.mmread(io.StringIO(text))
    _assert_same(s.to_scipy(), want)
    assert s.nnz == _canonical(want).nnz == rep["nnz"]
    assert len(set(zip(r, c))) < len(r)  # the input had duplicates (summed above)


def test_unsorted_duplicates_and_explicit_zeros_rectangular(tmp_path, rng):
    r, c, v = _entries(rng, 7, 300, 2000)
    v[:50] = [0] * 50
    text = _mtx(r, c, v, (7, 300))
    (tmp_path / "w.mtx").write_text(text)
    blocklin.convert(tmp_path / "w.mtx", tmp_path / "w.zarr", memory="64MiB")
    _assert_same(blocklin.open(tmp_path / "w.zarr").to_scipy(), scipy.io.mmread(io.StringIO(text)))


def test_empty_and_zero_row_matrices(tmp_path):
    (tmp_path / "e.mtx").write_text("%%MatrixMarket matrix coordinate real general\n5 3 0\n")
    blocklin.convert(tmp_path / "e.mtx", tmp_path / "e.zarr")
    s = blocklin.open(tmp_path / "e.zarr")
    assert s.shape == (5, 3) and s.nnz == 0 and s.to_scipy().toarray().sum() == 0
    (tmp_path / "z.mtx").write_text("%%MatrixMarket matrix coordinate real general\n0 4 0\n")
    blocklin.convert(tmp_path / "z.mtx", tmp_path / "z.zarr")
    assert blocklin.open(tmp_path / "z.zarr").to_scipy().shape == (0, 4)


# -- the layout: any zarr reader opens it ------------------------------------------------------------

def test_layout_is_plain_zarr(tmp_path, rng):
    x = scipy.sparse.random(90, 70, density=0.1, random_state=3, format="csr")
    blocklin.from_sparse(x, tmp_path / "x.zarr", memory="64MiB")
    g = zarr.open_group(str(tmp_path / "x.zarr"), mode="r")
    attrs = dict(g.attrs)
    assert attrs["format"] == "blocklin-csr" and attrs["format_version"] == 1
    assert attrs["shape"] == [90, 70] and attrs["dtype"] == "float64" and attrs["nnz"] == x.nnz
    assert attrs["blocklin"]["operation"] == "from_sparse"
    assert g["indptr"].dtype == np.int64 and g["indices"].dtype == np.int32 and g["row_blocks"].dtype == np.int64
    got = scipy.sparse.csr_matrix((g["data"][:], g["indices"][:], g["indptr"][:]), shape=(90, 70))
    _assert_same(got, x)
    rb = g["row_blocks"][:]
    assert rb[0] == 0 and rb[-1] == 90 and np.all(np.diff(rb) > 0)
    assert sorted(p.name for p in (tmp_path / "x.zarr").iterdir()) == ["data", "indices", "indptr", "row_blocks",
                                                                       "zarr.json"]


def test_handle_reads_strips_and_refuses_what_does_not_fit(tmp_path):
    x = scipy.sparse.random(500, 80, density=0.05, random_state=1, format="csr")
    s = blocklin.from_sparse(x, tmp_path / "s.zarr")
    assert s.shape == (500, 80) and s.nnz == x.nnz and s.density == pytest.approx(x.nnz / 40000)
    assert sum(s.chunks) == 500 and s.n_blocks == len(s.row_blocks) - 1
    _assert_same(s.rows(17, 230), x[17:230])
    _assert_same(s.rows(5, 5), x[5:5])
    b0, b1 = int(s.row_blocks[0]), int(s.row_blocks[1])
    _assert_same(s.row_block(0), x[b0:b1])
    _assert_same(scipy.sparse.vstack([blk for _r0, blk in s.iter_row_blocks()]), x)
    assert "SparseMatrix(" in repr(s) and "nnz=" in repr(s) and "shape=(500, 80)" in repr(s)
    np.testing.assert_array_equal(s.to_numpy(), x.toarray())
    with pytest.raises(BudgetError, match=r"memory: to_scipy\(\) loads the whole CSR matrix.*row_block"):
        s.to_scipy(memory="1KiB")
    with pytest.raises(ParameterError, match="rows: must be integers with 0 <= r0 <= r1 <= 500"):
        s.rows(10, 501)
    with pytest.raises(ParameterError, match="i: must be a row-block number"):
        s.row_block(s.n_blocks)


# -- the external sort ----------------------------------------------------------------------------

def test_budget_forces_several_runs(tmp_path, rng):
    m, n, k = 6000, 3000, 300_000
    r, c, v = _entries(rng, m, n, k)
    text = _mtx(r, c, v, (m, n))
    (tmp_path / "b.mtx").write_text(text)
    rep = blocklin.convert(tmp_path / "b.mtx", tmp_path / "b.zarr", memory="24MiB")
    assert rep["runs"] > 1 and rep["row_blocks"] == rep["runs"]
    assert rep["planned_memory"] <= 24 * 2**20
    _assert_same(blocklin.open(tmp_path / "b.zarr").to_scipy(), scipy.io.mmread(tmp_path / "b.mtx"))


@pytest.mark.parametrize("symmetry", ["general", "symmetric"])
def test_larger_budgets_parse_larger_blocks_to_the_same_arrays(tmp_path, rng, symmetry):
    """A 64th of the budget sizes the parsed text blocks (1 MiB at 24 MiB, 4 MiB at 512 MiB); the
    stored arrays are the same, and SciPy's."""
    from blocklin.storage.formats.mtx import MtxReader
    from blocklin.storage.sparse_convert import MtxSource

    m, n, k = 3000, 3000, 120_000  # 1.3 MB of text: two blocks of 1 MiB, one of 4 MiB
    r, c, v = _entries(rng, m, n, k, lower=symmetry == "symmetric")
    (tmp_path / "b.mtx").write_text(_mtx(r, c, v, (m, n), symmetry=symmetry))
    for memory, block in ((24 << 20, 1 << 20), (512 << 20, 4 << 20)):
        src = MtxSource(MtxReader(str(tmp_path / "b.mtx")))
        src.fit_budget(memory)
        assert src.reader.block_bytes == block and src.parse_bytes == 4 * block
        src.close()
    blocklin.convert(tmp_path / "b.mtx", tmp_path / "small.zarr", memory="24MiB")
    blocklin.convert(tmp_path / "b.mtx", tmp_path / "large.zarr", memory="512MiB")
    want = scipy.io.mmread(tmp_path / "b.mtx")
    for out in ("small.zarr", "large.zarr"):
        _assert_same(blocklin.open(tmp_path / out).to_scipy(), want)


def test_runs_larger_than_the_budget_are_split_by_rows(tmp_path, rng):
    """Skewed rows: a run over the sort's capacity is bucketed again into narrower row blocks; one
    row over it is refused naming the row and a budget."""
    m, n = 64, 50
    r = np.concatenate([rng.integers(0, 4, 9000), rng.integers(0, m, 500)])  # rows 0..3 dense
    c = rng.integers(0, n, len(r))
    x = scipy.sparse.coo_matrix((rng.integers(1, 5, len(r)).astype(float), (r, c)), shape=(m, n))
    plan = SortPlan(rows_per_block=32, block_entries=4096, entry_chunk=1024, row_chunk=1024, batch_bytes=0,
                    peak_memory=0, memory=1 << 24)
    w = SparseWriter(tmp_path / "k.zarr", (m, n), np.float64, entry_chunk=1024, row_chunk=1024)
    work = tmp_path / "work"
    work.mkdir()
    external_sort(ScipySource(x), w, plan, str(work))
    assert w.n_blocks > 2 and list(work.iterdir()) == []
    w.commit()
    s = blocklin.open(tmp_path / "k.zarr")
    _assert_same(s.to_scipy(), x)
    assert s.row_blocks[1] < 32  # the first run was split

    one = scipy.sparse.coo_matrix((np.ones(6000), (np.zeros(6000, int), np.arange(6000) % n)), shape=(m, n))
    w = SparseWriter(tmp_path / "one.zarr", (m, n), np.float64, entry_chunk=1024, row_chunk=1024)
    with pytest.raises(BudgetError, match="memory: the entries of one row must fit.*row 1 holds 6000 entries"):
        external_sort(ScipySource(one), w, plan, str(work))
    w.abort()
    for f in work.iterdir():
        f.unlink()
    work.rmdir()
    assert not (tmp_path / "one.zarr").exists()


def test_pattern_runs_hold_linear_indices_and_split_by_rows(tmp_path, rng):
    """A source whose values are all 1 (a pattern file) keeps ``row * n + column`` alone in its runs:
    the skewed run is split as above and the duplicates become their counts, as SciPy sums them."""
    m, n = 64, 50
    r = np.concatenate([rng.integers(0, 4, 9000), rng.integers(0, m, 500)])
    c = rng.integers(0, n, len(r))
    x = scipy.sparse.coo_matrix((np.ones(len(r)), (r, c)), shape=(m, n))
    src = ScipySource(x)
    src.unit_values = True
    plan = SortPlan(rows_per_block=32, block_entries=4096, entry_chunk=1024, row_chunk=1024, batch_bytes=0,
                    peak_memory=0, memory=1 << 24)
    w = SparseWriter(tmp_path / "p.zarr", (m, n), np.float32, entry_chunk=1024, row_chunk=1024)
    work = tmp_path / "work"
    work.mkdir()
    external_sort(src, w, plan, str(work))
    assert w.n_blocks > 2 and list(work.iterdir()) == []
    w.commit()
    s = blocklin.open(tmp_path / "p.zarr")
    assert s.dtype == np.float32 and s.row_blocks[1] < 32
    _assert_same(s.to_scipy(), x.astype(np.float32))
    # a file: pattern general and symmetric, with duplicates, against mmread
    for symmetry in ("general", "symmetric"):
        rr, cc, _ = _entries(rng, 40, 40, 3000, lower=symmetry == "symmetric")
        (tmp_path / "g.mtx").write_text(_mtx(rr, cc, None, (40, 40), field="pattern", symmetry=symmetry))
        blocklin.convert(tmp_path / "g.mtx", tmp_path / "g.zarr", memory="24MiB", overwrite=True)
        _assert_same(blocklin.open(tmp_path / "g.zarr").to_scipy(), scipy.io.mmread(tmp_path / "g.mtx"))


def test_budget_too_small_names_a_budget_that_suffices(tmp_path, rng):
    r, c, v = _entries(rng, 50, 50, 100)
    (tmp_path / "a.mtx").write_text(_mtx(r, c, v, (50, 50)))
    with pytest.raises(BudgetError) as info:
        blocklin.convert(tmp_path / "a.mtx", tmp_path / "a.zarr", memory="1MiB")
    hint = str(info.value).rsplit("--memory ", 1)[1].rstrip(")")
    blocklin.convert(tmp_path / "a.mtx", tmp_path / "a.zarr", memory=hint)
    assert blocklin.open(tmp_path / "a.zarr").nnz > 0


# -- SciPy .npz in, exports out -----------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
def test_scipy_npz_round_trip(tmp_path, fmt):
    x = scipy.sparse.random(120, 90, density=0.08, random_state=4, format=fmt, dtype=np.float32)
    scipy.sparse.save_npz(tmp_path / "x.npz", x)
    rep = blocklin.convert(tmp_path / "x.npz", tmp_path / "x.zarr")
    assert rep["from"] == "npz" and rep["dtype"] == "float32"
    s = blocklin.open(tmp_path / "x.zarr")
    assert s.dtype == np.float32
    _assert_same(s.to_scipy(), x)


def test_npz_with_duplicates_and_unsorted_indices(tmp_path):
    data, indices, indptr = [1.0, 2.0, 3.0, 4.0, 5.0], [3, 0, 3, 1, 1], [0, 3, 3, 5]
    x = scipy.sparse.csr_matrix((data, indices, indptr), shape=(3, 4))
    scipy.sparse.save_npz(tmp_path / "d.npz", x, compressed=False)
    blocklin.convert(tmp_path / "d.npz", tmp_path / "d.zarr")
    _assert_same(blocklin.open(tmp_path / "d.zarr").to_scipy(), x)


def test_export_mtx_and_npz(tmp_path, rng):
    r, c, v = _entries(rng, 300, 200, 3000)
    text = _mtx(r, c, [x / 8 for x in v], (300, 200), "real", "general")
    (tmp_path / "a.mtx").write_text(text)
    blocklin.convert(tmp_path / "a.mtx", tmp_path / "a.zarr", memory="24MiB")
    want = scipy.io.mmread(io.StringIO(text))
    rep = blocklin.convert(tmp_path / "a.zarr", tmp_path / "back.mtx")
    assert rep["to"] == "mtx" and (tmp_path / "back.mtx").read_text().startswith(
        "%%MatrixMarket matrix coordinate real general")
    back = scipy.io.mmread(tmp_path / "back.mtx")
    assert back.nnz == _canonical(want).nnz  # no duplicates written
    _assert_same(_canonical(back), want)
    blocklin.convert(tmp_path / "a.zarr", tmp_path / "back.npz")
    _assert_same(scipy.sparse.load_npz(tmp_path / "back.npz"), want)
    with pytest.raises(BudgetError, match="memory: an .npz is written by scipy.sparse.save_npz from memory"):
        blocklin.convert(tmp_path / "a.zarr", tmp_path / "small.npz", memory="16KiB")
    with pytest.raises(FormatError, match="exported as .mtx"):
        blocklin.convert(tmp_path / "a.zarr", tmp_path / "a.npy")
    _nothing_left(tmp_path, "small.npz", "a.npy")


def test_layout_options(tmp_path, rng):
    r, c, v = _entries(rng, 20, 20, 50)
    (tmp_path / "a.mtx").write_text(_mtx(r, c, v, (20, 20)))
    rep = blocklin.convert(tmp_path / "a.mtx", tmp_path / "d.zarr", layout="dense")
    assert isinstance(blocklin.open(tmp_path / "d.zarr"), blocklin.Matrix) and "layout" not in rep
    np.testing.assert_array_equal(blocklin.open(tmp_path / "d.zarr").to_numpy(),
                                  scipy.io.mmread(tmp_path / "a.mtx").toarray())
    blocklin.convert(tmp_path / "a.mtx", tmp_path / "a.npy")  # a file output stays dense
    (tmp_path / "arr.mtx").write_text("%%MatrixMarket matrix array real general\n2 1\n1\n2\n")
    blocklin.convert(tmp_path / "arr.mtx", tmp_path / "arr.zarr")  # array files stay dense
    assert isinstance(blocklin.open(tmp_path / "arr.zarr"), blocklin.Matrix)
    with pytest.raises(FormatError, match="layout: a sparse output needs a coordinate source"):
        blocklin.convert(tmp_path / "arr.mtx", tmp_path / "x.zarr", layout="sparse")
    with pytest.raises(ConfigError, match="chunks: applies to dense outputs only"):
        blocklin.convert(tmp_path / "a.mtx", tmp_path / "x.zarr", chunks=(4, 4))
    with pytest.raises(ConfigError, match="layout: must be one of"):
        blocklin.convert(tmp_path / "a.mtx", tmp_path / "x.zarr", layout="csr")
    _nothing_left(tmp_path, "x.zarr")


# -- hostile input: refused, nothing left behind ------------------------------------------------------

HOSTILE = {
    "rows the entries do not back": ("1000000000 1000000000 2\n1 1 1\n5 5 2\n", FormatError,
                                     r"declared rows must be backed by entries.*1000000000 rows \(7.45 GiB"),
    "row out of range": ("3 3 2\n1 1 1\n4 1 2\n", FormatError, r"indices must lie in 1..3.*\(4, 1\) at line 5"),
    "column zero": ("3 3 2\n1 1 1\n2 0 2\n", FormatError, r"indices must lie in 1..3.*\(2, 0\) at line 5"),
    "fewer than announced": ("3 3 3\n1 1 1\n2 2 2\n", FormatError, "truncated"),
    "more than announced": ("3 3 1\n1 1 1\n2 2 2\n", FormatError, "must end after the entries the header announces"),
    "malformed line": ("3 3 2\n1 1 1\n2 2 two\n", FormatError, "line 5"),
    "missing value": ("3 3 2\n1 1 1\n2 2\n", FormatError, "each data line must hold 3 fields"),
    "NaN refused": ("3 3 2\n1 1 1\n2 2 nan\n", NonFiniteError, "must not hold NaN.*line 5.*--nan allow"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_mtx_is_refused_and_leaves_nothing(tmp_path, case):
    body, error, pattern = HOSTILE[case]
    (tmp_path / "h.mtx").write_text("%%MatrixMarket matrix coordinate real general\n% c\n" + body)
    with pytest.raises(error, match=pattern):
        blocklin.convert(tmp_path / "h.mtx", tmp_path / "h.zarr", nan="error")
    _nothing_left(tmp_path, "h.zarr")


def test_nan_copied_by_default_and_skew_diagonal_refused(tmp_path):
    (tmp_path / "n.mtx").write_text("%%MatrixMarket matrix coordinate real general\n2 2 2\n1 1 nan\n2 2 1\n")
    blocklin.convert(tmp_path / "n.mtx", tmp_path / "n.zarr")
    assert np.isnan(blocklin.open(tmp_path / "n.zarr").to_scipy()[0, 0])
    (tmp_path / "k.mtx").write_text("%%MatrixMarket matrix coordinate real skew-symmetric\n2 2 1\n1 1 3\n")
    with pytest.raises(FormatError, match="skew-symmetric matrix has a zero diagonal.*line 3"):
        blocklin.convert(tmp_path / "k.mtx", tmp_path / "k.zarr")
    _nothing_left(tmp_path, "k.zarr")


def test_hostile_npz_is_refused(tmp_path):
    x = scipy.sparse.csr_matrix(([1.0, 2.0], [0, 7], [0, 1, 2]), shape=(2, 8))
    bad = {"format": np.array(b"csr"), "shape": np.array([2, 3]), "data": x.data, "indices": x.indices,
           "indptr": x.indptr}
    np.savez(tmp_path / "bad.npz", **bad)
    with pytest.raises(FormatError, match=r"npz input: column indices must lie in 0..2; got 7 at entry 1"):
        blocklin.convert(tmp_path / "bad.npz", tmp_path / "o.zarr")
    np.savez(tmp_path / "short.npz", **{**bad, "shape": np.array([2, 8]), "indptr": np.array([0, 1])})
    with pytest.raises(FormatError, match="consistent lengths"):
        blocklin.convert(tmp_path / "short.npz", tmp_path / "o.zarr")
    np.savez(tmp_path / "dense.npz", x=np.ones((2, 2)))
    blocklin.convert(tmp_path / "dense.npz:x", tmp_path / "dense.zarr")  # a NumPy .npz member stays dense
    with pytest.raises(FormatError, match="layout: a SciPy sparse .npz converts to a sparse matrix only"):
        blocklin.convert(tmp_path / "bad.npz", tmp_path / "o.zarr", layout="dense")
    _nothing_left(tmp_path, "o.zarr")


def test_output_rules_hold(tmp_path, rng):
    r, c, v = _entries(rng, 10, 10, 20)
    (tmp_path / "a.mtx").write_text(_mtx(r, c, v, (10, 10)))
    blocklin.convert(tmp_path / "a.mtx", tmp_path / "a.zarr")
    from blocklin.errors import OutputExistsError

    with pytest.raises(OutputExistsError):
        blocklin.convert(tmp_path / "a.mtx", tmp_path / "a.zarr")
    blocklin.convert(tmp_path / "a.mtx", tmp_path / "a.zarr", overwrite=True)
    (tmp_path / "mine.zarr").mkdir()
    (tmp_path / "mine.zarr" / "notes.txt").write_text("keep")
    with pytest.raises(OutputExistsError):
        blocklin.convert(tmp_path / "a.mtx", tmp_path / "mine.zarr", overwrite=True)
    assert (tmp_path / "mine.zarr" / "notes.txt").read_text() == "keep"
    _nothing_left(tmp_path)


# -- command line -------------------------------------------------------------------------------------

def test_cli_convert_info_and_export(tmp_path, rng, capsys):
    r, c, v = _entries(rng, 30, 40, 200)
    (tmp_path / "a.mtx").write_text(_mtx(r, c, v, (30, 40), "integer", "general"))
    assert main(["convert", str(tmp_path / "a.mtx"), str(tmp_path / "a.zarr"), "--memory", "32MiB"]) == 0
    out = capsys.readouterr().out
    assert "sparse float64" in out and "1 row block from 1 run" in out
    assert main(["info", str(tmp_path / "a.zarr")]) == 0
    out = capsys.readouterr().out
    assert "blocklin-csr" in out and "30 x 40" in out and "density" in out and "row blocks" in out
    assert main(["info", str(tmp_path / "a.zarr"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["nnz"] == blocklin.open(tmp_path / "a.zarr").nnz and d["format"] == "blocklin-csr"
    assert main(["convert", str(tmp_path / "a.zarr"), str(tmp_path / "b.mtx"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["to"] == "mtx"
    _assert_same(scipy.io.mmread(tmp_path / "b.mtx").tocsr(), scipy.io.mmread(tmp_path / "a.mtx"))
    assert main(["convert", str(tmp_path / "a.mtx"), str(tmp_path / "d.zarr"), "--dense"]) == 0
    assert isinstance(blocklin.open(tmp_path / "d.zarr"), blocklin.Matrix)
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "a.mtx"), str(tmp_path / "e.zarr"), "--codec", "zstd"]) == 1
    assert "codec: applies to dense outputs only" in capsys.readouterr().err
    _nothing_left(tmp_path, "e.zarr")


def test_handle_converts_like_its_path(tmp_path):
    s = blocklin.from_sparse(scipy.sparse.eye(5, format="csr") * 2, tmp_path / "e.zarr")
    blocklin.convert(s, tmp_path / "e.mtx")
    _assert_same(_canonical(scipy.io.mmread(tmp_path / "e.mtx")), scipy.sparse.eye(5) * 2)


def test_failures_after_runs_were_written_leave_nothing(tmp_path, rng):
    """A bad line in a later batch (runs already on disk) and a row too dense for the budget (found
    while the runs are sorted): refused, the work folder and the partial output gone."""
    r, c, v = _entries(rng, 500, 500, 70_000)
    text = _mtx(r, c, v, (500, 500)).replace("% comment\n500 500 70000", "% comment\n500 500 70001")
    (tmp_path / "late.mtx").write_text(text + "1 1 x\n")
    with pytest.raises(FormatError, match="line 70004"):
        blocklin.convert(tmp_path / "late.mtx", tmp_path / "late.zarr", memory="24MiB")
    k = 400_000  # more than the 327451 entries a 24 MiB budget sorts at once
    (tmp_path / "row.mtx").write_text(f"%%MatrixMarket matrix coordinate pattern general\n2 {k} {k}\n"
                                      + "".join(f"1 {j}\n" for j in range(1, k + 1)))
    with pytest.raises(BudgetError, match=f"row 1 holds {k} entries.*--memory") as info:
        blocklin.convert(tmp_path / "row.mtx", tmp_path / "row.zarr", memory="24MiB")
    _nothing_left(tmp_path, "late.zarr", "row.zarr")
    hint = str(info.value).rsplit("--memory ", 1)[1].rstrip(")")
    assert blocklin.convert(tmp_path / "row.mtx", tmp_path / "row.zarr", memory=hint)["nnz"] == k
    assert list((tmp_path / "blocklin-tmp").iterdir()) == []


# -- the coordinate parse in text blocks and the run sort ---------------------------------------------

@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of at most 10 lines read 320 characters at a time: every block boundary case is hit."""
    from blocklin.storage.formats import mtx

    monkeypatch.setattr(mtx, "PARSE_BATCH_BYTES", 320)


@pytest.mark.parametrize("ending", ["\n", "\r\n"])
@pytest.mark.parametrize("last_newline", [True, False])
def test_mtx_read_in_small_blocks_matches_scipy(tmp_path, rng, small_blocks, ending, last_newline):
    r, c, v = _entries(rng, 30, 20, 237)
    lines = [f"{a}{' ' * (k % 3 + 1)}{b}\t{x / 4}" for k, (a, b, x) in enumerate(zip(r, c, v))]
    text = "%%MatrixMarket matrix coordinate real general\n% c\n30 20 237\n" + "\n".join(lines)
    text = (text + ("\n" if last_newline else "")).replace("\n", ending)
    (tmp_path / "b.mtx").write_bytes(text.encode())
    rep = blocklin.convert(tmp_path / "b.mtx", tmp_path / "b.zarr", memory="64MiB")
    want = scipy.io.mmread(io.StringIO(text.replace("\r\n", "\n")))
    _assert_same(blocklin.open(tmp_path / "b.zarr").to_scipy(), want)
    assert rep["entries_read"] == 237


@pytest.mark.parametrize(("line", "bad", "error", "pattern"), [
    (150, "% a comment among the entries", FormatError, "each data line must hold 3 fields.*line 150"),
    (151, "", FormatError, "each data line must hold 3 fields.*0 at line 151"),
    (152, "1 1 1 1", FormatError, "each data line must hold 3 fields.*4 at line 152"),
    (153, "1 x 1", FormatError, "line 153"),
    (154, "31 1 1", FormatError, r"\(31, 1\) at line 154"),
    (155, "1 1 nan", NonFiniteError, "NaN at line 155"),
])
def test_bad_lines_in_later_blocks_name_their_line(tmp_path, rng, small_blocks, line, bad, error, pattern):
    r, c, v = _entries(rng, 30, 20, 200)
    lines = [f"{a} {b} {x}" for a, b, x in zip(r, c, v)]
    lines[line - 4] = bad  # the banner, a comment and the size line come first
    (tmp_path / "e.mtx").write_text("%%MatrixMarket matrix coordinate real general\n% c\n30 20 200\n"
                                    + "\n".join(lines) + "\n")
    with pytest.raises(error, match=pattern):
        blocklin.convert(tmp_path / "e.mtx", tmp_path / "e.zarr", memory="64MiB", nan="error")
    _nothing_left(tmp_path, "e.zarr")


@pytest.mark.parametrize(("tail", "pattern"), [
    ("1 1 1\n", "extra data at line 204"),
    ("\n\n  \n1 1 1\n", "extra data at line 207"),
    ("1 1", "extra data at line 204"),
])
def test_extra_data_right_after_the_entries_is_refused(tmp_path, rng, small_blocks, tail, pattern):
    r, c, v = _entries(rng, 30, 20, 200)
    body = "".join(f"{a} {b} {x}\n" for a, b, x in zip(r, c, v))
    (tmp_path / "x.mtx").write_text("%%MatrixMarket matrix coordinate real general\n% c\n30 20 200\n" + body + tail)
    with pytest.raises(FormatError, match=pattern):
        blocklin.convert(tmp_path / "x.mtx", tmp_path / "x.zarr", memory="64MiB")
    (tmp_path / "y.mtx").write_text("%%MatrixMarket matrix coordinate real general\n% c\n30 20 201\n" + body)
    with pytest.raises(FormatError, match=r"end of file at line 204 \(200 found\).*truncated"):
        blocklin.convert(tmp_path / "y.mtx", tmp_path / "y.zarr", memory="64MiB")
    (tmp_path / "z.mtx").write_text("%%MatrixMarket matrix coordinate real general\n% c\n30 20 200\n" + body
                                    + "\n  \n")
    assert blocklin.convert(tmp_path / "z.mtx", tmp_path / "z.zarr", memory="64MiB")["entries_read"] == 200
    _nothing_left(tmp_path, "x.zarr", "y.zarr")


def test_nth_newline_both_ways():
    from blocklin.storage.formats.mtx import _nth_newline

    text = "".join(f"{k} {k}\n" for k in range(300)) + "7 7"
    where = [i for i, ch in enumerate(text) if ch == "\n"]
    for k in (1, 2, 150, 236, 237, 299, 300):  # searched from the end (<= 64 past) and by index
        assert _nth_newline(text, k, 300) == where[k - 1]
    assert _nth_newline("a\u00e9\ufffdb\nc\n", 2, 2) == 6  # one offset a character, ASCII or not


@pytest.mark.parametrize("wide", [False, True])
def test_run_sort_keeps_source_order_of_duplicates(rng, wide):
    """The packed key sort and, for keys too wide to pack, the unstable argsort with ties put back in
    order both give what a stable argsort gives: duplicates summed in source order, bit for bit."""
    from blocklin.storage.sparse_convert import _sorted_block, _stable_argsort, run_dtype

    n = 2**50 + 3 if wide else 37
    k = 5000
    rec = np.empty(k, run_dtype(np.float64))
    rec["r"] = rng.integers(0, 20, k) + 100
    rec["c"] = rng.integers(0, 30, k) * (n // 30)
    rec["v"] = rng.standard_normal(k) * 10.0 ** rng.integers(-12, 12, k)  # sums depend on their order
    key = (rec["r"] - 100) * n + rec["c"]
    order = np.argsort(key, kind="stable")
    got, ks = _stable_argsort(key)
    np.testing.assert_array_equal(got, order)
    np.testing.assert_array_equal(ks, key[order])
    starts = np.flatnonzero(np.concatenate([[True], key[order][1:] != key[order][:-1]]))
    indptr, cols, sums = _sorted_block(rec.copy(), 100, 120, n, np.dtype(np.int64))  # it reuses its input
    assert sums.tobytes() == np.add.reduceat(rec["v"][order], starts).tobytes()
    np.testing.assert_array_equal(cols, key[order][starts] % n)
    np.testing.assert_array_equal(indptr, np.concatenate([[0], np.cumsum(np.bincount(key[order][starts] // n,
                                                                                      minlength=20))]))


def test_a_chunk_write_failing_on_the_writer_thread_fails_the_conversion_and_leaves_nothing(tmp_path, monkeypatch):
    """Chunk files are written by a thread of their own beside the sort: its error (a full disk) reaches the
    conversion, which removes its partial output after the thread stopped writing into it."""
    import blocklin.storage.rawchunks as rawchunks

    x = scipy.sparse.random(4000, 300, density=0.05, random_state=3, format="csr")
    written = []
    real = rawchunks.VectorChunkFiles.write

    def fills_up(self, index, buf):
        if len(written) == 3:
            raise OSError(28, "No space left on device")
        written.append(index)
        real(self, index, buf)

    monkeypatch.setattr(rawchunks.VectorChunkFiles, "write", fills_up)
    with pytest.raises(OSError, match="No space"):
        blocklin.from_sparse(x, tmp_path / "S.zarr", memory="9MiB")
    assert len(written) == 3
    _nothing_left(tmp_path, "S.zarr")
    monkeypatch.setattr(rawchunks.VectorChunkFiles, "write", real)
    _assert_same(blocklin.from_sparse(x, tmp_path / "S.zarr", memory="9MiB").to_scipy(), x)


def test_a_narrower_dtype_never_wraps_or_overflows(tmp_path):
    """``dtype=`` narrower than the values: integers are refused outright (entries and the sums of
    duplicates are formed in the output dtype, where they would wrap: int64 402 became int8 -110), a
    finite float beyond the narrower float's range is refused naming its entry (it became inf), and
    values in range are stored as NumPy casts them."""
    x = scipy.sparse.csr_matrix(np.array([[402, 0], [0, -1000]], dtype=np.int64))
    with pytest.raises(DTypeError, match="int64 -> int8"):
        blocklin.from_sparse(x, tmp_path / "i8.zarr", dtype="int8")
    y = scipy.sparse.csr_matrix(np.array([[7e44, 0], [0, 1e-9]]))
    with pytest.raises(DTypeError, match="float32.*7e\\+44 at entry 0"):
        blocklin.from_sparse(y, tmp_path / "f32.zarr", dtype="float32")
    assert not (tmp_path / "f32.zarr").exists() and not (tmp_path / "i8.zarr").exists()
    z = scipy.sparse.csr_matrix(np.array([[7e4, 0], [0, 1e-9]]))
    s = blocklin.from_sparse(z, tmp_path / "ok.zarr", dtype="float32")
    assert s.dtype == np.float32 and np.array_equal(s.to_scipy().data, z.data.astype(np.float32))
    assert blocklin.from_sparse(x, tmp_path / "wide.zarr", dtype="float64").to_scipy().data.tolist() == [402.0, -1000.0]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_duplicates_summing_beyond_the_dtype_are_refused(tmp_path, dtype):
    """Duplicate entries are summed in the output dtype: finite duplicates whose sum leaves its range
    (two 3e38 in float32, two 1e308 in float64) are refused naming the entry (the sum became inf,
    silently, on the old code); duplicates of an inf in the file stay inf, as SciPy sums them, and a
    finite sum is stored."""
    big = "3e38" if dtype == "float32" else "1e308"
    text = ("%%MatrixMarket matrix coordinate real general\n4 3 5\n"
            f"1 1 1.5\n3 2 {big}\n2 3 -2\n3 2 {big}\n4 1 inf\n")
    (tmp_path / "d.mtx").write_text(text)
    with pytest.raises(DTypeError, match=r"dtype: must hold the sums of duplicate entries .*row 2, column 1 "
                                         rf"\(counted from 0\) sum to inf in {dtype}"):
        blocklin.convert(tmp_path / "d.mtx", tmp_path / "d.zarr", dtype=dtype, memory="64MiB")
    _nothing_left(tmp_path, "d.zarr")
    (tmp_path / "ok.mtx").write_text(text.replace(f"3 2 {big}", "3 2 1e30").replace("4 1 inf", "4 1 inf\n4 1 5"))
    (tmp_path / "ok.mtx").write_text((tmp_path / "ok.mtx").read_text().replace("4 3 5", "4 3 6"))
    blocklin.convert(tmp_path / "ok.mtx", tmp_path / "ok.zarr", dtype=dtype, memory="64MiB")
    got = blocklin.open(tmp_path / "ok.zarr").to_scipy()
    want = scipy.io.mmread(tmp_path / "ok.mtx").tocsr().astype(dtype)
    assert got.dtype == np.dtype(dtype) and np.array_equal(got.toarray(), want.toarray())
    assert np.isinf(got[3, 0]) and got[2, 1] == np.dtype(dtype).type(1e30) * 2


@pytest.mark.parametrize("src, dtype, name", [(np.float64, "float16", "dtype"), (np.float32, np.float16, "dtype"),
                                              (np.longdouble, None, "x"), (np.float64, np.longdouble, "dtype")])
def test_value_dtypes_scipy_or_zarr_cannot_hold_are_refused(tmp_path, src, dtype, name):
    """``dtype="float16"`` wrote a group whose ``rows()`` and ``to_scipy()`` raised SciPy's ValueError (its
    sparse matrices hold no float16), and a ``longdouble`` matrix met zarr's ValueError ("No Zarr data type
    found"); both are refused by name before anything is written, with the dtype that holds the values
    (found by a randomized search, 2026-12-07)."""
    x = scipy.sparse.csr_matrix(np.array([[1.5, 0], [0, -2.25]], dtype=src))
    with pytest.raises(DTypeError, match=rf"^{name}: must .*(float16|extended precision).*Fix: .*dtype='float(32|64)'"):
        blocklin.from_sparse(x, tmp_path / "h.zarr", dtype=dtype)
    _nothing_left(tmp_path, "h.zarr")
    fix = "float32" if np.dtype(dtype or src) == np.float16 else "float64"
    s = blocklin.from_sparse(x, tmp_path / "ok.zarr", dtype=fix)  # the named fix holds the values exactly
    assert s.to_scipy().dtype == np.dtype(fix) and np.array_equal(s.to_scipy().toarray(), x.toarray())
    if name == "x":  # convert's name of its input is src (and the CLI's flag --dtype)
        scipy.sparse.save_npz(tmp_path / "x.npz", x)
        with pytest.raises(DTypeError, match=r"^src: must not be extended precision.*--dtype float64"):
            blocklin.convert(tmp_path / "x.npz", tmp_path / "c.zarr")
        _nothing_left(tmp_path, "c.zarr")


@pytest.mark.parametrize("dtype, dups, wraps", [(np.int8, [100, 100], -56), (np.int8, [-100, -29], 127),
                                                (np.uint8, [200, 56], 0), (np.int64, [2**62, 2**62], -2**63),
                                                (np.uint64, [2**63, 2**63], 0)])
def test_integer_duplicates_summing_beyond_the_dtype_are_refused(tmp_path, dtype, dups, wraps):
    """Duplicate integer entries are summed in their dtype, where a sum beyond its range wraps (SciPy's
    ``sum_duplicates`` too: int8 ``100 + 100`` is ``-56``): it was stored so, without a word, where a float sum
    beyond the range is refused (found by a randomized search, 2026-12-07). Refused naming the entry, the exact
    sum and the wrapped one; sums that reach the range's ends exactly, or wrap only on the way (``100 - 100 +
    100`` in int8), are stored as SciPy sums them."""
    info = np.iinfo(dtype)
    rows, cols = [1] * len(dups) + [0], [2] * len(dups) + [0]
    x = scipy.sparse.coo_matrix((np.array(dups + [3], dtype), (rows, cols)), shape=(3, 4))
    assert x.tocsr()[1, 2] == wraps  # SciPy's sum
    with pytest.raises(DTypeError, match=rf"^dtype: must hold the sums of duplicate entries .*row 1, column 2 "
                                         rf".*sum to {sum(dups)}, which {np.dtype(dtype).name} wraps to {wraps}\."):
        blocklin.from_sparse(x, tmp_path / "w.zarr")
    _nothing_left(tmp_path, "w.zarr")
    edge = [info.max - 1, 1] if dups[0] > 0 else [info.min + 1, -1]
    fits = scipy.sparse.coo_matrix((np.array(edge + ([100, -100, 100] if dtype == np.int8 else [3]), dtype),
                                    ([1, 1] + [0] * (3 if dtype == np.int8 else 1),
                                     [2, 2] + [0] * (3 if dtype == np.int8 else 1))), shape=(3, 4))
    got = blocklin.from_sparse(fits, tmp_path / "ok.zarr").to_scipy()
    assert got.dtype == dtype and np.array_equal(got.toarray(), fits.tocsr().toarray())
