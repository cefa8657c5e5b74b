"""Chunk sides given to from_array and random: two positive integers, anything else refused by name."""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import ShapeError


def test_chunks_other_than_a_pair_of_positive_integers_are_refused_by_name(tmp_path):
    """An int alone (NumPy's and zarr's spelling for every axis) had raised "'int' object is not
    iterable" (``random``: "'int' object is not subscriptable"); 2.5 was cut to 2, and ``random`` took
    any string for ``"auto"``."""
    cases = [(1, r"chunks=\(1, 1\)"), (4, r"chunks=\(4, 4\)"), ((2.5, 3), "two positive integers"),
             ((True, 3), "two positive integers"), ((0, 3), "two positive integers"),
             ((2, 3, 1), "two positive integers"), ("square", "chunks='auto'")]
    for chunks, fix in cases:
        for make in (lambda c: bl.from_array(np.ones((5, 5)), tmp_path / "a.zarr", chunks=c),
                     lambda c: bl.random(tmp_path / "a.zarr", (5, 5), chunks=c)):
            with pytest.raises(ShapeError, match=rf"chunks: must be 'auto' or \(rows, cols\), two positive "
                               rf"integers; got .*Fix: .*{fix}"):
                make(chunks)
            assert not (tmp_path / "a.zarr").exists()
    m = bl.from_array(np.ones((5, 5)), tmp_path / "b.zarr", chunks=(np.int64(2), 5))
    assert m.chunks == (2, 5)
