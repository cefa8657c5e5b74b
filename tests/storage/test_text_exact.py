"""Text formats (CSV/TSV, Matrix Market) keep every value or refuse: what a float parse or a float64
repr would change beyond rounding is named by line and column, and CSV quirks (a byte order mark,
quoted numbers) never drop a row silently."""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import FormatError


def _csv(tmp_path, data: bytes, name="in.csv"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


@pytest.mark.parametrize("data, dtype", [(b"1,2\n1e400,4\n", None), (b"1,-1e39\n3,4\n", "float32"),
                                         (b"1,2\n3,1e5\n", "float16")])
def test_csv_number_beyond_the_dtype_is_refused_not_inf(tmp_path, data, dtype):
    """``1e400`` parsed as float64 is Inf: the value is lost, as a cast to a narrower float would lose
    it (which convert refuses); the text's own ``inf`` still reads as Inf."""
    with pytest.raises(FormatError, match=r"must fit .*line [12], column [12]") as err:
        bl.convert(_csv(tmp_path, data), tmp_path / "o.npy", dtype=dtype)
    assert "Inf" in str(err.value) and not (tmp_path / "o.npy").exists()
    bl.convert(_csv(tmp_path, b"inf,-Infinity\n+inf,nan\n", "ok.csv"), tmp_path / "ok.npy")
    got = np.load(tmp_path / "ok.npy")
    assert np.isposinf(got[0, 0]) and np.isneginf(got[0, 1]) and np.isposinf(got[1, 0]) and np.isnan(got[1, 1])


def test_csv_integer_beyond_float64_is_refused_and_read_exactly_as_int64(tmp_path):
    """``2**53 + 1`` parsed as float64 is ``2**53``: an id column would change silently. Refused, naming
    the fix; with ``dtype='int64'`` every bit comes back, and a float64-exact ``2**60`` still reads."""
    a = np.array([[2**53 + 1, 2**62 + 1], [-(2**63), 2**63 - 1]], np.int64)
    np.save(tmp_path / "a.npy", a)
    bl.convert(tmp_path / "a.npy", tmp_path / "a.csv")
    with pytest.raises(FormatError, match=r"'9007199254740993' at line 1, column 1.*--dtype int64"):
        bl.convert(tmp_path / "a.csv", tmp_path / "b.npy")
    bl.convert(tmp_path / "a.csv", tmp_path / "b.npy", dtype="int64")
    np.testing.assert_array_equal(np.load(tmp_path / "b.npy"), a)
    bl.convert(_csv(tmp_path, b"1152921504606846976,1.5\n", "exact.csv"), tmp_path / "e.npy")
    assert np.load(tmp_path / "e.npy")[0, 0] == 2.0**60


def test_float32_parse_refuses_an_integer_it_cannot_hold(tmp_path):
    """The bound is the parse dtype's: float32 holds every integer up to 2**24, not 2**24 + 1."""
    with pytest.raises(FormatError, match=r"float32 .*'16777217' at line 1, column 2"):
        bl.convert(_csv(tmp_path, b"1,16777217\n"), tmp_path / "o.npy", dtype="float32")


@pytest.mark.parametrize("body", [b"1\n2\n3\n", b"1,2\n3,4\n", b"a,b\n1,2\n"])
def test_csv_byte_order_mark_is_not_part_of_the_first_field(tmp_path, body):
    """A UTF-8 byte order mark (Excel's "CSV UTF-8") before ``1``: the first line is data. It had made
    a one-column file's first value a header (its row dropped, silently) and refused ``'\\ufeff1'`` in
    wider ones."""
    plain = _csv(tmp_path, body, "plain.csv")
    bl.convert(plain, tmp_path / "plain.npy")
    bl.convert(_csv(tmp_path, b"\xef\xbb\xbf" + body), tmp_path / "o.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), np.load(tmp_path / "plain.npy"))


@pytest.mark.parametrize("data", [b'"1","2"\n', b'"1","2"\n"3","4"\n'])
def test_quoted_numbers_are_data_not_a_header(tmp_path, data):
    """A line of quoted numbers had been taken for a header: a one-line file became a 0 x 2 matrix,
    silently. It is data now, and the quoted field is named."""
    with pytest.raises(FormatError, match=r"'\"1\"' at line 1, column 1"):
        bl.convert(_csv(tmp_path, data), tmp_path / "o.npy")
    bl.convert(_csv(tmp_path, b'"a","b"\n1,2\n', "hdr.csv"), tmp_path / "h.npy")  # quoted names: a header
    np.testing.assert_array_equal(np.load(tmp_path / "h.npy"), [[1.0, 2.0]])


@pytest.mark.parametrize("out", ["o.csv", "o.tsv", "o.mtx"])
def test_extended_precision_is_written_exactly(tmp_path, out):
    """longdouble (80-bit on x86) had been formatted through float64: ``1 + 2**-63`` written as ``1.0``
    under a report that said float128. Each value is now written in the shortest form that reads back
    to it in its own dtype."""
    f = np.finfo(np.longdouble)
    if f.nmant <= np.finfo(np.float64).nmant:
        pytest.skip("longdouble is float64 on this platform")
    a = np.array([[1 + f.eps, -0.0, np.nan, np.inf], [-np.inf, -f.tiny, f.max, 1 / np.longdouble(3)]],
                 np.longdouble)
    np.save(tmp_path / "a.npy", a)
    bl.convert(tmp_path / "a.npy", tmp_path / out)
    lines = [ln for ln in (tmp_path / out).read_text().splitlines() if ln and not ln.startswith("%")]
    if out.endswith(".mtx"):
        texts = lines[1:]  # column-major, one value a line
        vals = np.array([np.longdouble(t) for t in texts]).reshape(a.shape, order="F")
    else:
        sep = "\t" if out.endswith(".tsv") else ","
        vals = np.array([[np.longdouble(t) for t in ln.split(sep)] for ln in lines])
    same = (vals == a) | (np.isnan(vals) & np.isnan(a))
    assert same.all() and np.array_equal(np.signbit(vals), np.signbit(a))
    if not out.endswith(".mtx"):  # and blocklin reads it back bit for bit with dtype='longdouble'
        bl.convert(tmp_path / out, tmp_path / "b.npy", dtype="longdouble")
        b = np.load(tmp_path / "b.npy")
        assert (((b == a) | (np.isnan(b) & np.isnan(a))).all() and np.array_equal(np.signbit(b), np.signbit(a)))


MTX_HEAD = {"array": b"%%MatrixMarket matrix array real general\n2 1\n",
            "coordinate": b"%%MatrixMarket matrix coordinate real general\n2 1 2\n"}


@pytest.mark.parametrize("layout", ["array", "coordinate"])
@pytest.mark.parametrize("out", ["o.npy", "o.zarr"])
def test_mtx_number_beyond_float64_is_refused_not_inf(tmp_path, layout, out):
    """The same in a ``real`` Matrix Market file, on the line-by-line parse and on the fast parse of
    coordinate blocks (SciPy's C++ reader, which returned Inf without a word). An integer literal in
    a file whose banner declares ``real`` rounds as any real number does."""
    body = b"1e400\n2\n" if layout == "array" else b"1 1 1e400\n2 1 2\n"
    p = tmp_path / "m.mtx"
    p.write_bytes(MTX_HEAD[layout] + body)
    with pytest.raises(FormatError, match=rf"must fit float64.*'1e400' at line 3, column {1 if layout == 'array' else 3}"):
        bl.convert(p, tmp_path / out)
    assert not (tmp_path / out).exists()
    p.write_bytes(MTX_HEAD[layout] + body.replace(b"1e400", b"9007199254740993"))
    bl.convert(p, tmp_path / "int.npy", layout="dense")
    assert np.load(tmp_path / "int.npy")[0, 0] == 2.0**53


def test_csv_integer_beyond_int64_reads_as_the_nearest_float(tmp_path):
    """Only integers int64 holds are refused (reading them as int64 is the fix); larger ones can only
    be read as floats, and are."""
    bl.convert(_csv(tmp_path, b"123456789012345678901234567890,1\n"), tmp_path / "o.npy")
    assert np.load(tmp_path / "o.npy")[0, 0] == 123456789012345678901234567890.0


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_subnormal_longdouble_reads_exactly_without_a_warning(tmp_path):
    """NumPy's longdouble string parse warns ``overflow encountered in conversion from string`` for a
    subnormal it returns exactly (``strtold`` reports ERANGE); the warning had leaked from every CSV
    read with dtype='longdouble'. The value must come back exact and nothing be said."""
    f = np.finfo(np.longdouble)
    if f.nmant <= np.finfo(np.float64).nmant:
        pytest.skip("longdouble is float64 on this platform")
    tiny = f.smallest_subnormal * 3
    text = np.format_float_scientific(tiny, unique=True)
    p = _csv(tmp_path, f"{text},2\n3,-{text}\n".encode())
    bl.convert(p, tmp_path / "b.npy", dtype="longdouble")
    b = np.load(tmp_path / "b.npy")
    assert b.dtype == np.longdouble and b[0, 0] == tiny and b[1, 1] == -tiny and b[0, 1] == 2
