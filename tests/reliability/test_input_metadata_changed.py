"""An input whose ``zarr.json`` alone changes the values it reads: its fill value, with a chunk not stored.

A zarr array another program wrote may leave out chunks that hold only the fill value (zarr's
``write_empty_chunks=False``): a read of them returns the fill value ``zarr.json`` names. A new fill
value there changes the matrix without touching a chunk file, and the coverage an output records of an
input (its data stamp: chunk files only) did not see it. So ``blocklin.update`` of ``gram(A)`` after the
fill value changed found ``A`` current and kept the Gram matrix of the old values (off by 100 % of its
norm from today's), and the commit's check of the inputs took the change for an append of no rows:
``gram(A)`` with the fill value changed mid-run committed a matrix of neither version (its blocks read
before the change took the missing chunk as zeros, those after as sevens). The coverage now records the
input's layout (the metadata that says how its chunks read: dtype, fill value, codecs, grid), which an
append never changes: a change of it is refused mid-run and by :func:`blocklin.update`. (A resumed run
already started over: its check compares every file's stamp, ``zarr.json``'s too.)
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

import blocklin
import blocklin.runtime.blockops as blockops
from blocklin.errors import InputChangedError, ParameterError

N = 120


def _with_a_missing_chunk(path) -> np.ndarray:
    """``path``: an N x N float64 array written by zarr, one chunk of zeros (its fill value) not stored."""
    a = np.random.default_rng(7).standard_normal((N, N))
    a[40:80, :40] = 0
    z = zarr.create_array(str(path), shape=a.shape, chunks=(40, 40), dtype="float64", fill_value=0.0,
                          config={"write_empty_chunks": False})
    z[...] = a
    assert not (path / "c" / "1" / "0").exists()
    return a


def _new_fill_value(path, value: float) -> None:
    meta = json.loads((path / "zarr.json").read_text())
    meta["fill_value"] = value
    (path / "zarr.json").write_text(json.dumps(meta))


def test_fill_value_changed_mid_run_commits_nothing(tmp_path, monkeypatch):
    """``gram(A)`` with the fill value changed after its third block of rows: the blocks read after it
    took the missing chunk as sevens, those before as zeros (the result committed had been 146 % off
    the old values' Gram matrix and 100 % off the new ones', norm-wise)."""
    _with_a_missing_chunk(tmp_path / "A.zarr")
    real, seen = blockops.mark_done, []

    def mark_then_change(done, unit):
        seen.append(unit)
        if len(seen) == 3:
            _new_fill_value(tmp_path / "A.zarr", 7.0)
        real(done, unit)

    monkeypatch.setattr(blockops, "mark_done", mark_then_change)
    with pytest.raises(InputChangedError, match="A.zarr changed during the run"):
        blocklin.gram(tmp_path / "A.zarr", out=tmp_path / "G.zarr", memory="128KiB", scheduler="sync")
    assert len(seen) > 3 and not (tmp_path / "G.zarr").exists()


def test_update_refuses_an_input_whose_fill_value_changed(tmp_path):
    _with_a_missing_chunk(tmp_path / "A.zarr")
    blocklin.gram(tmp_path / "A.zarr", out=tmp_path / "G.zarr")
    _new_fill_value(tmp_path / "A.zarr", 7.0)  # the rows of the missing chunk now read as sevens
    with pytest.raises(ParameterError, match="fill value"):
        blocklin.update(tmp_path / "G.zarr")
