"""An updatable sketch made by an older test-matrix generator is updated with that generator.

The update must add the appended rows' terms as a recompute of the grown matrix *with the sketch's own
generator* has them, so it is compared with such a recompute within the rounding bounds of
``test_update_sketch`` (the same helpers); sketches kept before the version was recorded (no
``generator`` in their parameters) were made by generator 1. The bound tells the generators apart: the
state updated with the current generator's rows is outside it. A generator this version does not have is
recomputed, with the reason in the report.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import blocklin as bl
from blocklin.linalg.blocks import random as rnd
from blocklin.linalg.lowrank.updatable import SKETCH_XT
from test_update_sketch import K, M, SEED, _check_against_recompute, _stored


def _edit_update_params(path, **changes):
    """Rewrite the stored result's update parameters (``None``: the key removed), as older versions left them."""
    meta_path = path / "zarr.json"
    meta = json.load(open(meta_path))
    upd = meta["attributes"]["blocklin"]["params"]["update"]
    for key, value in changes.items():
        if value is None:
            upd.pop(key, None)
        else:
            upd[key] = value
    json.dump(meta, open(meta_path, "w"))


@pytest.mark.parametrize(("made_by", "recorded"), [(1, True), (1, False), (2, True)])
def test_a_sketch_made_by_an_older_generator_is_updated_exactly(tmp_path, monkeypatch, made_by, recorded):
    """Generator 1 (sketches made before the version was recorded, ``recorded=False``) and generator 2
    (Gaussian ``Upsilon`` and ``Phi``) sketches updated by this version (generator 3, random signs)."""
    a, (new,), path = _stored(tmp_path, np.float64)
    monkeypatch.setattr(rnd, "SKETCH_GENERATOR", made_by)  # the sketch as an older version made it
    first = bl.svd(path, K, method="sketch", seed=SEED, out=tmp_path / "F.zarr", updatable=True, memory="256KiB")
    assert first.report["sketch_generator"] == made_by
    stored = json.load(open(tmp_path / "F.zarr" / "zarr.json"))["attributes"]["blocklin"]
    assert stored["params"]["update"]["generator"] == made_by
    if not recorded:
        _edit_update_params(tmp_path / "F.zarr", generator=None)
    monkeypatch.setattr(rnd, "SKETCH_GENERATOR", rnd.GENERATOR_SIGNS)  # this version
    bl.append(path, new)
    res = bl.update(tmp_path / "F.zarr", memory="256KiB")
    r = res.report
    assert r["sketch_generator"] == made_by and r["updated"]["generator"] == made_by and r["passes"] == 1
    assert "drawn by it too" in r["updated"]["generator_note"]
    stored = json.load(open(tmp_path / "F.zarr" / "zarr.json"))["attributes"]["blocklin"]
    assert stored["params"]["update"]["generator"] == made_by  # a later update keeps drawing from it
    grown = np.vstack([a, new])
    monkeypatch.setattr(rnd, "SKETCH_GENERATOR", made_by)  # the recompute it must equal
    bounds, got, ref = _check_against_recompute(tmp_path, res, grown, np.float64)
    # the same appended rows drawn by this version's generator leave the bound
    kp = got[SKETCH_XT].shape[1]
    rows = [rnd.row_test_rows(SEED, rnd.STREAM_UPSILON, kp, generator=g).rows(M, M + len(new))
            for g in (rnd.GENERATOR_SIGNS, made_by)]
    wrong = got[SKETCH_XT] + new.T @ (rows[0] - rows[1])
    assert not (np.abs(wrong - ref[SKETCH_XT]) <= bounds[SKETCH_XT]).all()


def test_a_sketch_made_by_an_unknown_generator_is_recomputed(tmp_path):
    a, (new,), path = _stored(tmp_path, np.float64)
    bl.svd(path, K, method="sketch", seed=SEED, out=tmp_path / "F.zarr", updatable=True)
    _edit_update_params(tmp_path / "F.zarr", generator=99)
    bl.append(path, new)
    res = bl.update(tmp_path / "F.zarr")
    how = res.report["updated"]["how"]
    assert how.startswith("recomputed: the sketch was made by test-matrix generator 99, which this version does not "
                          "have (it has [1, 2, 3])"), how
    rec = bl.svd(path, K, method="sketch", seed=SEED)
    assert np.array_equal(res.s, rec.s)  # the recompute: generator 3, updatable again
    stored = json.load(open(tmp_path / "F.zarr" / "zarr.json"))["attributes"]["blocklin"]
    assert stored["params"]["update"]["generator"] == 3
