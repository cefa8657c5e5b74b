"""Outputs committed before their provenance listed their member arrays (``attrs["blocklin"]["members"]``).

Such a group carries the operation that wrote it, and ``overwrite`` replaces the arrays of that
operation's layout (:mod:`blocklin.storage.layouts`) and nothing else: an array, a folder or another
output someone put inside it still refuses, the tree unchanged. The old format is today's output with
the ``members`` entry removed (that entry is all the record-era commit added,
``git log -S members -- blocklin/storage``).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import scipy.sparse as sp
import zarr

import blocklin as bl

from support.interrupts import tree_bytes
from blocklin.errors import OutputExistsError
from blocklin.storage.layouts import layout_members

RNG = np.random.default_rng(0)
A = RNG.standard_normal((40, 6))


def _without_members(path) -> None:
    """Rewrite ``path``'s root metadata as commits wrote it before they listed members."""
    meta_path = os.path.join(path, "zarr.json")
    with open(meta_path) as f:
        meta = json.load(f)
    assert "members" in meta["attributes"]["blocklin"]
    del meta["attributes"]["blocklin"]["members"]
    with open(meta_path, "w") as f:
        json.dump(meta, f)




def _groups(tmp_path) -> dict:
    """One group of each operation that writes groups, its members recorded by today's commit."""
    S = bl.from_sparse(sp.random(40, 6, density=0.4, random_state=1, format="csr"), tmp_path / "S.zarr")
    made = {
        "svd": lambda o, ow=False: bl.svd(A, 3, out=o, seed=0, overwrite=ow),
        "pca updatable": lambda o, ow=False: bl.pca(bl.from_array(A, tmp_path / "A.zarr", overwrite=True), 3,
                                                     out=o, updatable=True, seed=0, overwrite=ow),
        "sketch updatable": lambda o, ow=False: bl.svd(bl.from_array(A, tmp_path / "A.zarr", overwrite=True), 3,
                                                       method="sketch", updatable=True, out=o, seed=0, overwrite=ow),
        "eigsh": lambda o, ow=False: bl.eigsh(A.T @ A, 2, out=o, seed=0, order="ascending", overwrite=ow),
        "sparse": lambda o, ow=False: bl.from_sparse(sp.random(30, 5, density=0.3, random_state=2, format="csr"), o,
                                                     overwrite=ow),
        "sparse pca": lambda o, ow=False: bl.pca(S, 2, out=o, seed=0, overwrite=ow),
    }
    return made


def test_todays_groups_list_members_within_their_layout(tmp_path):
    """The layouts name every member today's group outputs record (else an old group of that
    operation would be refused)."""
    for name, make in _groups(tmp_path).items():
        out = tmp_path / f"{name.replace(' ', '_')}.zarr"
        make(out)
        meta = json.loads((out / "zarr.json").read_text())
        members = meta["attributes"]["blocklin"]["members"]
        assert members and set(members) <= set(layout_members(meta)), (name, members)


def test_overwrite_replaces_an_old_blocklin_group(tmp_path):
    """A group without ``members`` (written before commits listed them) is replaced by
    ``overwrite=True``: it had been refused as 'holding files blocklin did not write', its own ``U``,
    ``S``, ``Vt`` counted as foreign, with an ``rm -r`` to run by hand."""
    for name, make in _groups(tmp_path).items():
        out = tmp_path / f"{name.replace(' ', '_')}.zarr"
        make(out)
        _without_members(out)
        old = (out / "zarr.json").stat().st_ino
        make(out, True)
        assert (out / "zarr.json").stat().st_ino != old, name
        assert "members" in json.loads((out / "zarr.json").read_text())["attributes"]["blocklin"]


@pytest.mark.parametrize("intruder", ["array", "folder", "output", "below a member", "group named U"])
def test_what_was_put_inside_an_old_group_still_refuses(tmp_path, intruder):
    """Only the layout's names, as plain arrays, are blocklin's in an old group: another array,
    a folder, a blocklin output of its own, a node below a member, or a group under a layout name
    refuses ``overwrite`` and the tree stays byte for byte."""
    out = tmp_path / "F.zarr"
    bl.svd(A, 3, out=out, seed=0, return_singular_vectors="vh")  # no U: its name is free
    _without_members(out)
    if intruder == "array":
        zarr.create_array(str(out / "mine"), shape=(2,), chunks=(2,), dtype="f8")[:] = 1.0
    elif intruder == "folder":
        (out / "notes").mkdir()
        (out / "notes" / "zarr.json").write_text("{}")
    elif intruder == "output":
        bl.from_array(A, out / "U")  # an output of its own under a layout name
    elif intruder == "below a member":
        zarr.create_array(str(out / "S" / "inner"), shape=(2,), chunks=(2,), dtype="f8")[:] = 1.0
    else:
        zarr.open_group(str(out / "U"), mode="w")
        zarr.create_array(str(out / "U" / "x"), shape=(2,), chunks=(2,), dtype="f8")[:] = 1.0
    before = tree_bytes(out)
    with pytest.raises(OutputExistsError, match="blocklin did not write"):
        bl.svd(A, 3, out=out, seed=1, overwrite=True)
    assert tree_bytes(out) == before


def test_an_old_array_output_is_its_root_alone(tmp_path):
    """An array output (no members) is replaced as before; a folder put inside it refuses, whatever
    its name (a layout's name counts in groups only)."""
    out = tmp_path / "C.zarr"
    bl.matmul(A, A.T, out)
    zarr.create_array(str(out / "U"), shape=(2,), chunks=(2,), dtype="f8")[:] = 1.0
    before = tree_bytes(out)
    with pytest.raises(OutputExistsError, match="blocklin did not write"):
        bl.matmul(A, A.T, out, overwrite=True)
    assert tree_bytes(out) == before
