"""Indexing a :class:`blocklin.Matrix` as NumPy indexes: a bad index is an ``IndexError`` naming it,
checked before any read (never a "damaged store" ``StoreReadError``), negative steps read the forward
range reversed, and iteration gives the rows."""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
import blocklin.matrix as matrix
from blocklin.errors import MatrixIndexError, ParameterError, StoreReadError


@pytest.fixture
def mx(tmp_path):
    x = np.arange(60.0).reshape(6, 10)
    return bl.from_array(x, tmp_path / "x.zarr", chunks=(4, 4)), x


GOOD = [5, -1, -6, (2, 3), (-1, -1), np.int64(3), slice(None, None, -1), (slice(None, None, -1), 0),
        (slice(None, None, 2), slice(None, None, -2)), (slice(5, 0, -2), slice(8, 1, -3)), (slice(1, 1, -1),),
        (slice(0, 5, -1), 2), (2, slice(None, None, -1)), (slice(-100, 100), slice(None, None, -7)),
        (Ellipsis, 1), (1, Ellipsis), Ellipsis, (Ellipsis, slice(None, None, -3)), ([0, 2, -1],),
        (slice(None), [1, 3]), (np.array([True, False] * 3), 2), ([0, 5], slice(None, None, -1)), ([], 1)]


@pytest.mark.parametrize("key", GOOD, ids=repr)
def test_indexing_matches_numpy(mx, key):
    m, x = mx
    got, want = m[key], x[key]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_a_boolean_mask_of_the_shape(mx):
    m, x = mx
    mask = x % 3 == 0
    np.testing.assert_array_equal(m[mask], x[mask])


BAD = [(6, "index 6", "axis 0"), (-7, "index -7", "axis 0"), ((0, 10), "index 10", "axis 1"),
       ((1, 2, 3), "3 indices", "2 axes"), (([0, 7],), "index 7", "axis 0"),
       ((np.array([True]),), "length 1", "axis 0"), ((None,), "None", "axis 0"), ((1.5,), "1.5", "axis 0"),
       ((slice(0.5, 2),), "0.5", "start"), (([0, 1], [1, 2]), "both axes", "one axis"),
       ((Ellipsis, Ellipsis), "got 2", "Ellipsis"), (np.ones((3, 10), bool), "shape (3, 10)", "mask")]


@pytest.mark.parametrize(("key", "actual", "rule"), BAD, ids=lambda v: repr(v)[:30])
def test_a_bad_index_is_an_index_error_not_a_damaged_store(mx, key, actual, rule):
    m, _ = mx
    with pytest.raises(MatrixIndexError) as err:
        m[key]
    assert isinstance(err.value, IndexError) and not isinstance(err.value, StoreReadError)
    msg = str(err.value)
    assert actual in msg and rule in msg and "Fix:" in msg and "damaged" not in msg


def test_a_zero_step_is_refused_as_numpy_refuses_it(mx):
    m, _ = mx
    with pytest.raises(ParameterError, match="step must not be zero"):
        m[::0]


def test_out_of_range_on_a_four_row_matrix(tmp_path):
    m = bl.from_array(np.eye(4), tmp_path / "e.zarr")
    with pytest.raises(IndexError, match="index 4"):
        m[4]
    np.testing.assert_array_equal(m[::-1, 0], np.eye(4)[::-1, 0])


@pytest.mark.parametrize("limit", [64 << 20, 3 * 80, 8])  # whole chunks, part of a chunk, one row at a time
def test_iteration_gives_the_rows(mx, monkeypatch, limit):
    m, x = mx
    monkeypatch.setattr(matrix, "_ITER_BYTES", limit)
    rows = list(m)
    assert len(rows) == 6
    np.testing.assert_array_equal(np.array(rows), x)
    assert [r.shape for r in m] == [(10,)] * 6


def test_iteration_reads_each_chunk_once(mx, monkeypatch):
    m, x = mx
    reads = []
    real = matrix.Matrix._read
    monkeypatch.setattr(matrix.Matrix, "_read", lambda self, key, how="basic": reads.append(key) or real(self, key, how))
    assert len(list(m)) == 6
    assert reads == [(slice(0, 6, 1), slice(0, 10, 1))]  # one strip: not one read per row


def test_iterating_an_empty_matrix(tmp_path):
    assert list(bl.from_array(np.zeros((0, 3)), tmp_path / "z.zarr")) == []


def test_a_stored_vector_indexes_and_iterates_as_numpy(tmp_path):
    import zarr

    z = zarr.create_array(tmp_path / "v.zarr", shape=(5,), chunks=(2,), dtype="f8")
    z[:] = np.arange(5.0)
    v = bl.open(tmp_path / "v.zarr")
    ref = np.arange(5.0)
    assert np.array_equal(v[::-1], ref[::-1]) and v[-1] == ref[-1] and np.array_equal(v[[0, 4]], ref[[0, 4]])
    assert [float(x) for x in v] == list(ref)
