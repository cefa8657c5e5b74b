"""``solve(..., resume=True)`` for the routes made of steps over work stores: the square systems (LU,
Cholesky) and the stored-Gram Tikhonov route, interrupted from Python (Ctrl-C raised inside a task
after a share of an uninterrupted run's chunk writes: mid-factorization early, mid-refinement late).

The rerun must give the bits of an uninterrupted run, skip what was finished, and leave neither the
work folder nor a partial output behind. (SIGKILL, SIGINT and SIGTERM of ``blocklin solve`` are in
``tests/reliability/test_signals.py``.)
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import blocklin as bl
import blocklin.linalg.factor.lu_panels as lu_panels
import blocklin.runtime.blockops as blockops
import blocklin.runtime.tiles as tiles
from support.tolerances import assert_solve

N = 200
CASES = {  # name: (matrix, keywords); 1 MiB: the 200 x 200 Gram matrix with lam > 0 is stored, not held
    "lu": ("A", {}),
    "lu-equilibrated": ("G", {}),  # rows graded over 2^+-40: R A C and R b staged, x = C y
    "cholesky": ("S", {"assume_a": "pos"}),
    "sym": ("S", {"assume_a": "sym"}),
    "stored-gram": ("A", {"lam": 1.0}),
    "stored-gram-columns-apart": ("A", {"lam": 1.0}),  # b's columns near 2^600, 1, 2^-600: each by its own power
}
#: the powers of two the columns of Bapart.zarr are B's times (the case whose name ends so reads it)
APART = np.array([600, 0, -600])


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    d = tmp_path_factory.mktemp("solve-resume")
    rng = np.random.default_rng(7)
    a = rng.standard_normal((N, N))
    bl.from_array(a, d / "A.zarr", chunks=(40, 40))
    bl.from_array(a @ a.T + N * np.eye(N), d / "S.zarr", chunks=(40, 40))
    b = rng.standard_normal((N, 3))
    bl.from_array(b, d / "B.zarr", chunks=(40, 3))
    bl.from_array(np.ldexp(b, APART[None, :]), d / "Bapart.zarr", chunks=(40, 3))
    bl.from_array(2.0 ** np.round(np.linspace(-40, 40, N))[rng.permutation(N), None] * a, d / "G.zarr", chunks=(40, 40))
    return d


def _solve(d, name, out, tmp, **extra):
    matrix, kw = CASES[name]
    rhs = "Bapart" if name.endswith("columns-apart") else "B"
    return bl.solve(str(d / f"{matrix}.zarr"), str(d / f"{rhs}.zarr"), out=str(out), memory="1MiB", scheduler="sync",
                    temp_dir=str(tmp), **kw, **extra)


@pytest.mark.parametrize("when", [0.1, 0.85])  # of the chunk writes of an uninterrupted run
@pytest.mark.parametrize("name", list(CASES))
def test_ctrl_c_then_resume_gives_the_same_bits(stored, tmp_path, monkeypatch, name, when):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    writes = [0]

    def counting(real, kill_at=None):
        def write_block(*args, **kwargs):
            real(*args, **kwargs)
            writes[0] += 1
            if writes[0] == kill_at:
                raise KeyboardInterrupt
        return write_block

    for module in (blockops, lu_panels, tiles):  # every module that writes blocks by name
        monkeypatch.setattr(module, "write_block", counting(module.write_block))
    ref = _solve(stored, name, tmp_path / "ref.zarr", tmp)
    monkeypatch.undo()
    assert os.listdir(tmp) == []  # a finished run leaves no work folder
    # mid-factorization early, mid-refinement late, whatever the plans' tiles make the count
    kill_at, writes[0] = max(1, round(when * writes[0])), 0
    for module in (blockops, lu_panels, tiles):  # every module that writes blocks by name
        monkeypatch.setattr(module, "write_block", counting(module.write_block, kill_at))
    with pytest.raises(KeyboardInterrupt):
        _solve(stored, name, tmp_path / "x.zarr", tmp, resume=True)
    monkeypatch.undo()
    assert not (tmp_path / "x.zarr").exists()
    assert [f for f in os.listdir(tmp) if f.startswith("blocklin-solve-")], "the work folder is kept for the rerun"

    x = _solve(stored, name, tmp_path / "x.zarr", tmp, resume=True)
    np.testing.assert_array_equal(x.to_numpy(), ref.to_numpy())
    assert x.report["resumed"]
    assert os.listdir(tmp) == [] and not [f for f in os.listdir(tmp_path) if ".partial-" in f]
    # and the answer itself: against NumPy, to the forward error the system's condition number allows
    a = bl.open(str(stored / f"{CASES[name][0]}.zarr")).to_numpy()
    b = bl.open(str(stored / "B.zarr")).to_numpy()
    lam = CASES[name][1].get("lam", 0.0)
    want = np.linalg.solve(a.T @ a + lam**2 * np.eye(N), a.T @ b) if lam else np.linalg.solve(a, b)
    got = np.ldexp(x.to_numpy(), -APART[None, :]) if name.endswith("columns-apart") else x.to_numpy()
    assert_solve(got, want, a.T @ a + lam**2 * np.eye(N) if lam else a)


def test_resume_needs_out(stored, tmp_path):
    with pytest.raises(bl.errors.ParameterError, match="resume"):
        bl.solve(str(stored / "S.zarr"), str(stored / "B.zarr"), assume_a="pos", resume=True, memory="1MiB")
