"""Unusual kinds of in-memory input read as NumPy and SciPy read them, or refused by name.

``numpy.asarray`` is where every in-memory operand enters; what it reads wrongly without a word is
refused before it (``blocklin.operands.in_memory_array``):

* a ``numpy.ma.MaskedArray`` with masked entries: ``asarray`` drops the mask, so the values under it
  would be computed with. ``scipy.linalg`` refuses masked arrays (``_asarray_validated``); blocklin
  refuses those with masked entries and reads one with nothing masked as its data.
* extended precision (``numpy.longdouble``): ``numpy.linalg`` refuses it; blocklin computes in
  float64 at most, so a cast would drop its extra digits unasked (it had crashed in zarr, and
  ``lstsq`` had solved with a longdouble ``b`` rounded to float64 and returned a longdouble ``x``).

``from_array`` takes what the operations take: a Dask array whose chunk sizes a boolean mask left
unknown (it had crashed converting NaN to an integer) and refuses object arrays by name (zarr's own
error had been raised). Results of accepted kinds are compared with the same operation on the plain
float64 array, which gives the same bits (the same data, staged the same way), so equality is exact.
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import DTypeError, ParameterError


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the stores each test writes


def _data(m=9, n=6, seed=0):
    return np.random.default_rng(seed).standard_normal((m, n))


def _masked(x):
    mask = np.zeros(x.shape, bool)
    mask.flat[0] = True
    hidden = x.copy()
    hidden.flat[0] = 1e6  # what a mask-blind read computes with
    return np.ma.MaskedArray(hidden, mask=mask)


OPERATIONS = {
    "matmul": lambda a: bl.matmul(a, np.ones((6, 2))),
    "gram": lambda a: bl.gram(a),
    "norm": lambda a: bl.norm(a),
    "svd": lambda a: bl.svd(a, 2, seed=0),
    "qr": lambda a: bl.qr(a),
    "solve": lambda a: bl.solve(a, np.ones(9)),
    "lstsq": lambda a: bl.lstsq(a, np.ones(9)),
    "from_array": lambda a: bl.from_array(a, "A.zarr"),
    "Matrix @ a": lambda a: bl.from_array(np.ones((2, 9)), "L.zarr") @ a,
}


@pytest.mark.parametrize("op", sorted(OPERATIONS))
def test_masked_entries_refused(op):
    """A masked ``a`` is refused naming it (its masked entry's hidden 1e6 had been computed with)."""
    with pytest.raises(ParameterError, match=r"masked entries.*filled"):
        OPERATIONS[op](_masked(_data()))


@pytest.mark.parametrize("op", ["solve", "lstsq"])
def test_masked_b_refused(op):
    a, b = _data(), np.ma.MaskedArray(np.ones(9), mask=np.arange(9) == 3)
    with pytest.raises(ParameterError, match=r"^b: must not have masked entries"):
        getattr(bl, op)(a, b)


def test_masked_vector_times_matrix_refused():
    """``v @ M`` with a masked row vector ``v`` (NumPy's protocol on a stored matrix) refuses the mask."""
    m = bl.from_array(_data(), "A.zarr")
    with pytest.raises(ParameterError, match=r"masked entries"):
        _masked(np.ones(9)) @ m


def test_masked_dask_refused():
    """A Dask array of masked chunks is refused before it is staged (its masks would be dropped)."""
    x = da.ma.masked_array(da.from_array(_data(), chunks=3), mask=np.eye(9, 6, dtype=bool))
    with pytest.raises(ParameterError, match=r"^a: must not be a masked Dask array"):
        bl.gram(x)
    with pytest.raises(ParameterError, match=r"^x: must not be a masked Dask array"):
        bl.from_array(x, "A.zarr")


def test_nothing_masked_is_its_data():
    """A masked array with no masked entry is its data: the same result as the plain array."""
    a = _data()
    got = bl.gram(np.ma.MaskedArray(a, mask=np.zeros(a.shape, bool))).to_numpy()
    np.testing.assert_array_equal(got, bl.gram(a).to_numpy())


@pytest.mark.parametrize("op", sorted(OPERATIONS))
def test_longdouble_refused(op):
    """``numpy.longdouble`` is refused naming ``a`` and the cast that fixes it (zarr's "No Zarr data type"
    had been raised)."""
    if np.finfo(np.longdouble).bits <= 64:
        pytest.skip("longdouble is float64 on this platform")
    with pytest.raises(DTypeError, match=r"extended precision.*astype\(numpy.float64\)"):
        OPERATIONS[op](_data().astype(np.longdouble))


def test_lstsq_longdouble_b_refused():
    """``lstsq`` with a longdouble ``b`` is refused: it had been rounded to float64 and the float64 solution
    returned as longdouble, its extra digits lost without a word."""
    if np.finfo(np.longdouble).bits <= 64:
        pytest.skip("longdouble is float64 on this platform")
    with pytest.raises(DTypeError, match=r"^b: must not be extended precision"):
        bl.lstsq(_data(), np.ones(9, dtype=np.longdouble))


def test_from_array_dask_unknown_chunks():
    """``from_array`` of ``x[x[:, 0] > 0]`` (chunk sizes unknown until computed) stores the selected rows,
    as every operation stages such an array."""
    a = _data(40, 5)
    x = da.from_array(a, chunks=(7, 5))
    got = bl.from_array(x[x[:, 0] > 0], "A.zarr").to_numpy()
    np.testing.assert_array_equal(got, a[a[:, 0] > 0])


def test_from_array_object_refused():
    with pytest.raises(DTypeError, match=r"^x: must hold numbers.*Python objects"):
        bl.from_array(_data().astype(object), "A.zarr")


def test_from_array_path_refused():
    """``from_array`` of a path is refused naming ``bl.open`` ("x: must be 2-D; got shape ()" had been said:
    ``numpy.asarray`` read the name as a 0-d string)."""
    with pytest.raises(ParameterError, match=r"^x: must be an array.*blocklin.open"):
        bl.from_array("B.zarr", "A.zarr")


def test_append_masked_rows_refused():
    """``append`` of masked rows is refused naming ``rows`` (the values under the mask had been appended)."""
    bl.from_array(_data(), "A.zarr")
    with pytest.raises(ParameterError, match=r"^rows: must not have masked entries"):
        bl.append("A.zarr", _masked(np.ones((2, 6))))
    np.testing.assert_array_equal(bl.open("A.zarr").to_numpy(), _data())  # nothing appended


def test_pca_transform_masked_refused():
    """``PCAResult.transform`` of masked samples is refused naming ``x`` (the values under the mask had been
    projected); samples with nothing masked give the plain samples' scores."""
    a = _data(30, 6)
    p = bl.pca(a, 2, seed=0)
    with pytest.raises(ParameterError, match=r"^x: must not have masked entries"):
        p.transform(_masked(a[:4]))
    np.testing.assert_array_equal(p.transform(np.ma.MaskedArray(a[:4], mask=False)), p.transform(a[:4]))


@pytest.mark.parametrize("fmt", ["csr_matrix", "coo_array"])
def test_from_array_sparse_refused(fmt):
    """``from_array`` of a SciPy sparse matrix names ``from_sparse`` (it had been refused as "dtype object
    (Python objects)": ``numpy.asarray`` wraps the matrix in a 0-d object array)."""
    import scipy.sparse

    with pytest.raises(ParameterError, match=r"^x: must be a dense array.*from_sparse"):
        bl.from_array(getattr(scipy.sparse, fmt)(np.eye(3)), "A.zarr")


V0_CALLS = {
    "svd rsvd": lambda a, v0: bl.svd(a, 2, method="rsvd", seed=0, v0=v0),
    "svd lanczos": lambda a, v0: bl.svd(a, 2, method="lanczos", seed=0, v0=v0),
    "eigsh": lambda a, v0: bl.eigsh(a.T @ a, 2, seed=0, v0=v0, order="descending"),
    "eigsh center": lambda a, v0: bl.eigsh(a, 2, center=True, seed=0, v0=v0, order="descending"),
    "eigsh sparse": lambda a, v0: bl.eigsh(_stored_sparse(a.T @ a), 2, seed=0, v0=v0, order="descending"),
}


def _stored_sparse(x):
    import os

    import scipy.sparse

    if not os.path.exists("S.zarr"):
        bl.from_sparse(scipy.sparse.csr_matrix(x), "S.zarr")
    return "S.zarr"


@pytest.mark.parametrize("call", sorted(V0_CALLS))
def test_masked_v0_refused(call):
    """A masked starting vector ``v0`` is refused as a masked ``a`` is (its masked entry's hidden 1e6 had
    been read as the start, the mask dropped); with nothing masked it is its data."""
    a = _data(40, 6)
    with pytest.raises(ParameterError, match=r"^v0: must not have masked entries"):
        V0_CALLS[call](a, _masked(np.ones(6)))
    plain = V0_CALLS[call](a, np.ones(6))
    unmasked = V0_CALLS[call](a, np.ma.MaskedArray(np.ones(6), mask=np.zeros(6, bool)))
    np.testing.assert_array_equal(plain[0] if call.startswith("eigsh") else plain.s,
                                  unmasked[0] if call.startswith("eigsh") else unmasked.s)
