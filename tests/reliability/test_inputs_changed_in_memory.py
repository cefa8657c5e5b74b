"""An input rewritten while a run reads it, where the run returns its value in memory (no output commits).

``blocklin.norm``, ``cond``, ``slogdet``/``det``, ``svd``/``eigsh``/``lstsq``/``solve`` without ``out=``
and the NumPy protocol return a value, which no commit checks: ``norm(A)`` with ``A.zarr`` rewritten
after its first strip had returned the norm of a matrix that is neither version (sqrt of the old
strip's squares plus the new strips'), without a word. The run now stamps each stored input when it
opens it (``Job.operand``) and lists it again before the value is returned (``storage/input_guard``'s
``RunInputs``): the run is refused naming the input.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import zarr

import blocklin
import blocklin.device.stream as stream
from blocklin.errors import InputChangedError
from support.listings import count_listings

N = 240
MEMORY = "256KiB"  # several strips per pass


@pytest.fixture
def data(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    blocklin.from_array(np.random.default_rng(7).standard_normal((N, N)), d / "A.zarr", chunks=(40, 40))
    return d


def _rewrite(path) -> None:
    """New values in place, as another program writes them (zarr.json untouched)."""
    zarr.open_array(str(path), mode="r+")[...] = np.random.default_rng(8).standard_normal((N, N)) * 3


@pytest.fixture
def rewritten_mid_run(data, monkeypatch):
    """``A.zarr`` rewritten by another program once the run has read its second streamed item."""
    real, seen = stream.check_cancelled, []

    def tick():
        seen.append(1)
        if len(seen) == 2:
            _rewrite(data / "A.zarr")
        real()

    monkeypatch.setattr(stream, "check_cancelled", tick)
    return seen


CASES = {
    "norm": lambda a: blocklin.norm(a, memory=MEMORY, scheduler="sync"),
    "norm-1": lambda a: blocklin.norm(a, 1, memory=MEMORY, scheduler="sync"),
    "numpy-norm": lambda a: np.linalg.norm(blocklin.open(a)),
    "svd-values": lambda a: blocklin.svd(a, 3, return_singular_vectors=False, memory="1MiB", scheduler="sync",
                                         seed=0),
    "solve": lambda a: blocklin.solve(a, np.ones(N), memory="1MiB", scheduler="sync"),
    "slogdet": lambda a: blocklin.slogdet(a, memory="1MiB", scheduler="sync"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_value_of_an_input_rewritten_mid_run_is_refused(data, rewritten_mid_run, case):
    with blocklin.config.set(memory="1MiB", scheduler="sync"):
        with pytest.raises(InputChangedError, match=r"input .*A\.zarr changed during the run .*(was not returned|nothing was)"):
            CASES[case](data / "A.zarr")
    assert len(rewritten_mid_run) >= 2  # the rewrite came mid-run
    assert sorted(os.listdir(data)) == ["A.zarr"]


def test_an_input_is_listed_once_at_its_first_open_and_once_before_the_value_returns(data, monkeypatch):
    """Cost: one listing at the first open and one before the value is returned, per input per run
    (an operation running others inside: the outermost run's); an output's commit is that check."""
    listed = count_listings(monkeypatch)
    a = str(data / "A.zarr")
    want = np.linalg.norm(zarr.open_array(a)[...])
    assert blocklin.norm(a, memory=MEMORY) == pytest.approx(want, rel=N * np.finfo(float).eps)
    assert listed.count(a) == 2
    listed.clear()
    blocklin.matmul(a, a, data / "C.zarr", memory=MEMORY)  # the output's commit checks: no third listing
    assert listed.count(a) == 2
    listed.clear()
    blocklin.solve(a, np.ones(N), memory="1MiB")  # an LU, refinement products: runs inside the run
    assert listed.count(a) == 2, listed


def test_rows_appended_mid_run_pass(data, monkeypatch):
    """The run reads the rows it opened, which an append leaves as they were: its value is that version's."""
    a = str(data / "A.zarr")
    want = np.linalg.norm(zarr.open_array(a)[...])
    real, seen = stream.check_cancelled, []

    def tick():
        seen.append(1)
        if len(seen) == 2:
            blocklin.append(a, np.full((40, N), 1e3))
        real()

    monkeypatch.setattr(stream, "check_cancelled", tick)
    assert blocklin.norm(a, memory=MEMORY, scheduler="sync") == pytest.approx(want, rel=N * np.finfo(float).eps)
    assert len(seen) >= 2 and zarr.open_array(a).shape == (N + 40, N)


def test_a_sparse_input_rewritten_mid_run_is_refused(tmp_path, monkeypatch):
    """A stored sparse matrix is stamped when its handle opens it, and the run takes that stamp
    (``tests/reliability/test_inputs_changed_sparse.py``); values rewritten in place after the first
    row block was read. eigsh
    without ``out=`` claims no output: its eigenvalues had been returned."""
    import scipy.sparse

    import blocklin.runtime.sparse_pass as sparse_pass

    s = scipy.sparse.random(N, N, density=0.05, format="csr", random_state=1)
    s = (s + s.T).tocsr()
    path = tmp_path / "S.zarr"
    blocklin.from_sparse(s, path)
    real, reads = sparse_pass.read_block, []

    def read_then_rewrite(*args, **kw):
        block = real(*args, **kw)
        reads.append(1)
        if len(reads) == 1:
            data = zarr.open_array(str(path / "data"), mode="r+")
            data[...] = data[...] * 7 + 1
        return block

    monkeypatch.setattr(sparse_pass, "read_block", read_then_rewrite)
    with pytest.raises(InputChangedError, match=r"S\.zarr changed during the run .*was not returned"):
        blocklin.eigsh(blocklin.open(path), 2, scheduler="sync")
    assert reads


def test_an_output_the_run_replaces_is_not_checked_at_its_end(data):
    """A run that reads a store and then writes it as its output (``reads_output``: an update replaces
    the result it read) checks it at the commit, not again at its end, where its own commit replaced it."""
    from blocklin.storage.atomic import AtomicOutput
    from blocklin.storage.input_guard import run_inputs
    from blocklin.storage.location import as_location

    c = data / "C.zarr"
    blocklin.from_array(np.ones((4, 4)), c)
    with run_inputs() as (inputs, outermost):
        inputs.stamp(as_location(c))
        ao = AtomicOutput(c, overwrite=True, reads_output=True, temp_dir=data / "tmp")
        zarr.create_array(str(ao.array_path()), shape=(2, 2), dtype="f8", chunks=(2, 2))[...] = 2.0
        ao.commit("test")
        inputs.reading()  # the run read on after the commit
        inputs.check("the test result")
    assert outermost and zarr.open_array(str(c))[0, 0] == 2.0


def test_cond_of_an_input_rewritten_between_its_inverse_and_its_norm_is_refused(data, monkeypatch):
    """``cond(a, 1)`` is ``norm(a, 1) * norm(inv(a), 1)``, three runs: ``a`` rewritten after ``inv`` had given
    the norm of the new ``a`` times the old inverse's. They are one run now, checked at its end."""
    import blocklin.linalg.inverse.inverse as inverse

    a = data / "B.zarr"
    blocklin.from_array(np.random.default_rng(5).standard_normal((40, 40)), a, chunks=(20, 20))
    real = inverse.inv

    def inv_then_rewrite(*args, **kw):
        x = real(*args, **kw)
        zarr.open_array(str(a), mode="r+")[...] = np.random.default_rng(6).standard_normal((40, 40))
        return x

    monkeypatch.setattr(inverse, "inv", inv_then_rewrite)
    with pytest.raises(InputChangedError, match=r"B\.zarr changed during the run .*the cond result was not returned"):
        blocklin.cond(a, 1)
    assert sorted(os.listdir(data)) == ["A.zarr", "B.zarr"]
