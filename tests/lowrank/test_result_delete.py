"""``delete()`` of an svd or eigsh result removes the whole group it was written to (``report["output"]``:
the stored factor and the arrays beside it), where ``Matrix.delete`` on the stored factor left the group;
the in-memory arrays stay usable, and nothing beside the group is touched."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

import blocklin as bl


def _gone(result, folder: Path) -> None:
    group = Path(result.report["output"])
    assert group.exists()
    result.delete()
    assert not group.exists()
    assert (folder / "mine.txt").read_text() == "kept"  # a file beside the group is not the result's


def test_svd_delete_removes_its_temporary_group(tmp_path):
    (tmp_path / "mine.txt").write_text("kept")
    a = bl.random(tmp_path / "A.zarr", (300, 40), seed=0, chunks=(100, 40))
    with bl.config.set(temp_dir=str(tmp_path)):
        r = bl.svd(a, 3, seed=0)
    assert Path(r.report["output"]).parent == tmp_path
    s, vt = r.s.copy(), np.asarray(r.Vt).copy()
    _gone(r, tmp_path)
    np.testing.assert_array_equal(r.s, s)
    np.testing.assert_array_equal(np.asarray(r.Vt), vt)
    assert (tmp_path / "A.zarr").exists()  # the input stays


def test_sparse_svd_and_eigsh_delete_their_groups(tmp_path):
    (tmp_path / "mine.txt").write_text("kept")
    x = sp.random(2000, 2000, density=0.01, random_state=1, format="csr")
    gap = sp.diags(np.r_[np.zeros(1995), 10.0 * np.arange(1, 6)])  # a gap: the pairs converge at once
    s = bl.from_sparse((x + x.T + gap).tocsr(), tmp_path / "S.zarr")
    with bl.config.set(temp_dir=str(tmp_path)):
        svd = bl.svd(s, 3, seed=0)
        eig = bl.eigsh(s, 3, order="descending", tol=1e-6, out=str(tmp_path / "eig.zarr"), seed=0)
        in_memory = bl.eigsh(s, 3, order="descending", tol=1e-6, seed=0)
    _gone(svd, tmp_path)
    w = eig.w.copy()
    _gone(eig, tmp_path)
    np.testing.assert_array_equal(eig.w, w)
    before = sorted(p.name for p in tmp_path.iterdir())
    in_memory.delete()  # nothing was written: nothing to remove
    assert "output" not in in_memory.report and sorted(p.name for p in tmp_path.iterdir()) == before


def test_eigsh_delete_removes_the_group_written_to_out(tmp_path):
    (tmp_path / "mine.txt").write_text("kept")
    q = np.linalg.qr(np.random.default_rng(2).standard_normal((200, 200)))[0]
    a = (q * np.linspace(1, 2, 200)) @ q.T
    r = bl.eigsh((a + a.T) / 2, 2, order="descending", out=str(tmp_path / "eig.zarr"), seed=0)
    assert Path(r.report["output"]) == tmp_path / "eig.zarr"
    _gone(r, tmp_path)
