"""The fast parse of Matrix Market coordinate blocks (``storage/formats/mtx_parse.py``).

Two references: ``np.loadtxt``, the line-by-line parse the fast one must agree with bit for bit (a
block it takes is read to the same values; a block ``np.loadtxt`` refuses it must not take), on
random blocks mutated towards what the C++ reader would read silently wrong; and
``scipy.io.mmread`` on whole files converted through both paths.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import scipy.io

import blocklin
from blocklin.errors import FormatError
from blocklin.storage.formats import mtx_parse
from blocklin.storage.formats.mtx_parse import _well_formed, parse_coordinate_block
from support.hostile import leftovers

pytestmark = pytest.mark.skipif(not mtx_parse.AVAILABLE, reason="SciPy's fast_matrix_market reader is absent")

SHAPE = (40, 30)
NCOLS = {"real": 3, "integer": 3, "pattern": 2}


def _reference(lines: list[str], field: str):
    """What the line-by-line path reads: 0-based indices and values, or None where it refuses."""
    dt = np.float64 if field == "real" else np.int64
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # blank lines: "input contained no data"
            arr = np.loadtxt(lines, dtype=dt, ndmin=2, comments=None)
    except (ValueError, OverflowError):
        return None
    if arr.shape != (len(lines), NCOLS[field]):
        return None
    r, c = arr[:, 0], arr[:, 1]
    if np.any(r != np.trunc(r)) or np.any(c != np.trunc(c)) or np.abs(arr[:, :2]).max() > 2**53:
        return None
    r, c = r.astype(np.int64) - 1, c.astype(np.int64) - 1
    if np.any((r < 0) | (r >= SHAPE[0]) | (c < 0) | (c >= SHAPE[1])):
        return None
    return r, c, (arr[:, 2] if field != "pattern" else None)


def _fast(lines: list[str], field: str):
    k = len(lines)
    r, c = np.empty(k, np.int64), np.empty(k, np.int64)
    v = np.empty(k, np.int64 if field == "integer" else np.float64)
    if not parse_coordinate_block("\n".join(lines) + "\n", k, SHAPE, field, r, c, v):
        return None
    return r, c, (v if field != "pattern" else None)


VALUES = ["1", "-2", "0", "17", "3.25", "-0.5", ".5", "5.", "1e3", "1E-3", "-2.5e+02", "1.e5", "6.02214076e23",
          "1e400", "-1e-400", "0.1", "123456789012345678901234567890", "1.00000000000000011102230246251565",
          "007", "-0"]
# whole fields the fast parse must refuse (or read exactly as np.loadtxt does)
BAD_FIELDS = ["1.2.3", "1-2", "1e3e3", "1x", "1e", "1e+", "--1", "+1", "+.5", "nan", "NaN", "inf", "-inf",
              "0x1p3", "1D3", "1,5", "1_000", ".", "-", "e5", "1e5.3", "1.5e", "-.e5", ".e5", "1.5.", "1+2",
              "5-", "\u00e9", "1e-", "--", "1..2"]
# mutations of a whole line: extra and missing fields, fields run together, blank and comment lines
LINE_MUTATIONS = ["{r} {c} {v} 7", "{r} {c}", "{r}", "", "   ", "% comment", "{r} {c}{v}", "{r}{c} {v}",
                  "{r}.5 {c} {v}", "{r} {c}.5 {v}", "{r} {c}-1 {v}", "{r} {c}e1 {v}", "{r} {c} {v}x",
                  "{r}\x0b{c} {v}", "{r} {c} {v}\x0c", "0 {c} {v}", "{r} 31 {v}", "-1 {c} {v}",
                  "99999999999999999999 {c} {v}", "{r} {c} 99999999999999999999", "+{r} {c} {v}",
                  "{r} {c} {v} {v}", "\t{r}\t{c}\t{v}\t", "{r}  {c}   {v}"]


def _line(rng, field: str, value: str | None = None) -> str:
    r, c = int(rng.integers(1, SHAPE[0] + 1)), int(rng.integers(1, SHAPE[1] + 1))
    if field == "pattern":
        return f"{r} {c}"
    if value is None:
        value = str(int(rng.integers(-99, 100))) if field == "integer" else str(rng.choice(VALUES))
    return f"{r} {c} {value}"


def _mutated(rng, field: str) -> list[str]:
    lines = [_line(rng, field) for _ in range(int(rng.integers(1, 12)))]
    for _ in range(int(rng.integers(0, 3))):
        i = int(rng.integers(len(lines)))
        r, c = int(rng.integers(1, SHAPE[0] + 1)), int(rng.integers(1, SHAPE[1] + 1))
        if rng.random() < 0.5:
            v = str(rng.choice(BAD_FIELDS))
            lines[i] = f"{r} {c}" if field == "pattern" and rng.random() < 0.5 else \
                [f"{v} {c} 1", f"{r} {v} 1", f"{r} {c} {v}", f"{r} {v}"][int(rng.integers(4))]
        else:
            lines[i] = str(rng.choice(LINE_MUTATIONS)).format(r=r, c=c, v=_line(rng, "real").split()[-1])
    return lines


@pytest.mark.parametrize("field", ["real", "integer", "pattern"])
def test_fast_parse_agrees_with_loadtxt_or_declines(rng, field):
    """Random blocks, clean and mutated: what the fast parse takes it reads bit for bit as np.loadtxt;
    what np.loadtxt refuses (or reads to other values) it declines."""
    taken = declined = 0
    for trial in range(1500):
        lines = [_line(rng, field) for _ in range(int(rng.integers(1, 12)))] if trial % 3 == 0 else \
            _mutated(rng, field)
        want, got = _reference(lines, field), _fast(lines, field)
        if got is None:
            declined += 1
            continue
        taken += 1
        assert want is not None, lines
        for g, w in zip(got, want):
            if w is not None:
                np.testing.assert_array_equal(g, w.astype(g.dtype), err_msg=repr(lines))
                if g.dtype.kind == "f":  # the same bits: -0.0 and 0.0 apart
                    assert np.array_equal(np.signbit(g), np.signbit(w)), lines
    assert taken > 300 and declined > 300


@pytest.mark.parametrize("field", ["real", "integer", "pattern"])
@pytest.mark.parametrize("bad", ["1 1 1 7", "1 1.5 2", "1 1-5", "1 1 1,5", "1 1 0x1p3", "1 1 1.2.3", "1 1 1e3e3",
                                 "1 1 1x", "1 1 1e", "1 1\r2 2", "", "% c"])
def test_what_the_cxx_reader_reads_silently_wrong_is_declined(field, bad):
    """Lines the C++ reader alone reads without an error (it drops what follows its last field, and
    stops a number at a byte it cannot use) go to the line-by-line parse, with a clean line beside."""
    lines = ["2 3 4" if field != "pattern" else "2 3", bad, "1 1 1" if field != "pattern" else "1 1"]
    assert _fast(lines, field) is None
    if field == "pattern":  # a line of three fields beside one of one: the count alone would match
        assert _fast(["1 1 1", "2"], field) is None


def test_grammar_checks_alone():
    assert _well_formed(b"1 2 3\n4 5 -6.5e-3\n", 2, 3, "real")
    assert _well_formed(b" 1\t2 3 \n", 1, 3, "integer")
    assert _well_formed(b"1 2\n3 4\n", 2, 2, "pattern")
    assert not _well_formed(b"1 2 3", 1, 3, "real")  # the caller adds the last newline
    assert not _well_formed(b"1 2 3\n4 5 6\n", 1, 3, "real")  # the line count is the block's
    assert not _well_formed(b"1 2 3.5\n", 1, 3, "integer")
    assert not _well_formed(b"1 2 -3\n", 1, 2, "pattern")
    assert not _well_formed(b"1 2 3-\n", 1, 3, "integer")


def _file(rng, field: str, symmetry: str, k: int, ending: str = "\n") -> str:
    m = n = 50
    r = rng.integers(1, m + 1, k)
    c = rng.integers(1, n + 1, k)
    if symmetry != "general":
        r, c = np.maximum(r, c), np.minimum(r, c)
        if symmetry == "skew-symmetric":
            keep = r != c
            r, c = r[keep], c[keep]
    if field == "real":  # no duplicates: their sums' order is not what is compared here
        _, first = np.unique(r * (n + 1) + c, return_index=True)
        first = rng.permutation(first)
        r, c = r[first], c[first]
    forms = ["{:.17g}", "{:.3e}", "{:.6E}", "{!r}", "{:.0f}."]
    if field == "pattern":
        body = [f"{a} {b}" for a, b in zip(r, c)]
    elif field == "integer":
        body = [f"{a} {b} {v}" for a, b, v in zip(r, c, rng.integers(-10**12, 10**12, len(r)))]
    else:
        vals = (rng.standard_normal(len(r)) * 10.0 ** rng.integers(-30, 30, len(r))).tolist()
        body = [f"{a}\t{b}  " + forms[i % len(forms)].format(v) for i, (a, b, v) in enumerate(zip(r, c, vals))]
    head = f"%%MatrixMarket matrix coordinate {field} {symmetry}\n% c\n{m} {n} {len(body)}\n"
    return (head + "\n".join(body) + "\n").replace("\n", ending)


@pytest.mark.parametrize(("field", "symmetry"), [("real", "general"), ("integer", "symmetric"),
                                                 ("pattern", "symmetric"), ("real", "skew-symmetric")])
@pytest.mark.parametrize("ending", ["\n", "\r\n"])
def test_files_through_the_fast_parse_match_mmread(tmp_path, rng, field, symmetry, ending):
    text = _file(rng, field, symmetry, 3000, ending)
    (tmp_path / "f.mtx").write_bytes(text.encode())
    blocklin.convert(tmp_path / "f.mtx", tmp_path / "f.zarr", memory="64MiB")
    want = scipy.io.mmread(io.BytesIO(text.encode())).tocsr()
    want.sum_duplicates()
    got = blocklin.open(tmp_path / "f.zarr").to_scipy()
    np.testing.assert_array_equal(got.indptr, want.indptr)
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_array_equal(got.data, want.data)


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of at most 10 lines: the fast parse and the line-by-line one alternate within a file."""
    from blocklin.storage.formats import mtx

    monkeypatch.setattr(mtx, "PARSE_BATCH_BYTES", 320)


def test_blocks_mixing_both_paths_match_mmread(tmp_path, rng, small_blocks):
    """Values the fast parse declines (a leading plus, spelled-out infinities, exponents beyond
    float64's, an index written 7.0) in some blocks and not others: the result is SciPy's either way
    (a finite number beyond float64's range, which SciPy reads as Inf, is refused instead:
    test_text_exact.py)."""
    k = 400
    r, c = rng.integers(1, 41, k).tolist(), rng.integers(1, 31, k).tolist()
    v = (rng.integers(-50, 50, k) / 8).tolist()
    text = [f"{a} {b} {x!r}" for a, b, x in zip(r, c, v)]
    for i in range(0, k, 37):
        text[i] = f"{r[i]} {c[i]} +{abs(v[i])!r}"
    text[100] = f"{r[100]} {c[100]} inf"
    text[200] = f"{r[200]} {c[200]} -Infinity"
    text[300] = f"{r[300]} {c[300]} -1e-999"
    body = "%%MatrixMarket matrix coordinate real general\n40 30 400\n" + "\n".join(text) + "\n"
    (tmp_path / "m.mtx").write_text(body)
    blocklin.convert(tmp_path / "m.mtx", tmp_path / "m.zarr", memory="64MiB")
    got = blocklin.open(tmp_path / "m.zarr").to_scipy()
    want = scipy.io.mmread(io.StringIO(body.replace(" +", " "))).tocsr()  # SciPy's reader refuses "+"
    want.sum_duplicates()
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_array_equal(got.data, want.data)


@pytest.mark.parametrize(("bad", "pattern"), [
    ("3 3 1,5", "line 6"),                                     # the C++ reader alone: 1
    ("3 3 1 7", "each data line must hold 3 fields.*4 at line 6"),  # it alone: the 7 dropped
    ("3 3.5 1", "line 6"),                                     # it alone: value 0.5
    ("99999999999999999999 1 1", "line 6"),                    # it refuses: an overflow
    ("41 1 1", r"\(41, 1\) at line 6"),                        # it refuses: out of range
    ("3 3 1\u00e9", "line 6"),                                  # not ASCII: declined
    ("3 3 1\r7", "CR LF.*carriage return alone at line 6"),      # old Mac line ends
])
def test_bad_lines_are_named_whichever_parser_saw_them(tmp_path, bad, pattern):
    body = "".join(f"{i} {i} {i}.5\n" for i in range(1, 3)) + bad + "\n" + "4 4 4\n"
    (tmp_path / "b.mtx").write_bytes(("%%MatrixMarket matrix coordinate real general\n% c\n40 30 4\n" + body).encode())
    with pytest.raises(FormatError, match=pattern):
        blocklin.convert(tmp_path / "b.mtx", tmp_path / "b.zarr", memory="64MiB")
    assert leftovers(tmp_path) == []
    assert not (tmp_path / "b.zarr").exists()


def test_huge_indices_within_int64():
    """Indices past 2**31 (SciPy's reader then returns int64) through the fast parse."""
    m = n = 3 * 2**31
    body = f"%%MatrixMarket matrix coordinate real general\n{m} {n} 3\n{m} {n} 1.5\n1 {n} 2\n{m} 1 -3e-3\n"
    r, c, v = np.empty(3, np.int64), np.empty(3, np.int64), np.empty(3)
    assert parse_coordinate_block(body.split("\n", 2)[2], 3, (m, n), "real", r, c, v)
    want = scipy.io.mmread(io.StringIO(body))
    np.testing.assert_array_equal(r, want.row)
    np.testing.assert_array_equal(c, want.col)
    np.testing.assert_array_equal(v, want.data)


@pytest.mark.parametrize("symmetry", ["symmetric", "skew-symmetric"])
@pytest.mark.parametrize("diagonal", [0, 3, 200])
def test_mirrored_blocks_with_few_or_many_diagonal_entries(tmp_path, rng, symmetry, diagonal):
    """The mirror images are copied between a block's few diagonal entries, or gathered past many."""
    n, k = 300, 2000
    r = rng.integers(2, n + 1, k)
    c = np.minimum(rng.integers(1, n + 1, k), r - 1)  # strictly below the diagonal
    d = rng.choice(k, diagonal, replace=False)
    c[d] = r[d]
    v = rng.integers(-9, 10, k)
    if symmetry == "skew-symmetric":
        v[d] = 0
    body = "".join(f"{a} {b} {x}\n" for a, b, x in zip(r.tolist(), c.tolist(), v.tolist()))
    text = f"%%MatrixMarket matrix coordinate integer {symmetry}\n{n} {n} {k}\n" + body
    (tmp_path / "d.mtx").write_text(text)
    blocklin.convert(tmp_path / "d.mtx", tmp_path / "d.zarr", memory="64MiB")
    want = scipy.io.mmread(io.StringIO(text)).tocsr()
    want.sum_duplicates()
    got = blocklin.open(tmp_path / "d.zarr").to_scipy()
    np.testing.assert_array_equal(got.toarray(), want.toarray())


def test_without_the_cxx_reader_the_text_path_reads_the_same(tmp_path, rng, monkeypatch):
    """With SciPy's reader absent (SciPy older than 1.12) the file is read as text and every block
    parsed line by line: the same matrix, and the same refusals."""
    from blocklin.storage.formats import mtx

    monkeypatch.setattr(mtx, "AVAILABLE", False)
    monkeypatch.setattr(mtx_parse, "AVAILABLE", False)
    for field, symmetry in (("real", "general"), ("pattern", "symmetric")):
        text = _file(rng, field, symmetry, 2000, "\r\n")
        (tmp_path / "t.mtx").write_bytes(text.encode())
        blocklin.convert(tmp_path / "t.mtx", tmp_path / "t.zarr", memory="64MiB", overwrite=True)
        want = scipy.io.mmread(io.BytesIO(text.encode())).tocsr()
        want.sum_duplicates()
        got = blocklin.open(tmp_path / "t.zarr").to_scipy()
        np.testing.assert_array_equal(got.toarray(), want.toarray())
    (tmp_path / "x.mtx").write_text("%%MatrixMarket matrix coordinate real general\n4 4 2\n1 1 1\n2 2 2\n3 3 3\n")
    with pytest.raises(FormatError, match="extra data at line 5"):
        blocklin.convert(tmp_path / "x.mtx", tmp_path / "x.zarr", memory="64MiB")
