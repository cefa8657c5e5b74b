"""Storage faults found by kill and refusal runs of ``blocklin convert``: each test failed before its fix."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pytest
import zarr

import blocklin

_KILL = textwrap.dedent("""
    import os, signal, sys
    import blocklin

    class KillAfter:
        def start(self, total, desc): self.k = 0
        def advance(self, n=1):
            self.k += n
            if self.k >= int(sys.argv[3]):
                os.kill(os.getpid(), signal.SIGKILL)
        def close(self): pass

    blocklin.convert(sys.argv[1], sys.argv[2], chunks=(16, 45), memory="48KiB", codec="zstd",
                     progress=KillAfter())
""")


def _kill_after(tmp_path, src, out, blocks: int):
    """A zstd conversion of ``src`` killed with SIGKILL after ``blocks`` blocks: its partial output."""
    script = tmp_path / "kill.py"
    script.write_text(_KILL)
    proc = subprocess.run([sys.executable, str(script), str(src), str(out), str(blocks)], capture_output=True)
    assert proc.returncode == -9, proc.stderr.decode()
    partials = [p for p in tmp_path.iterdir() if p.name.startswith(f".{out.name}.partial-")]
    assert len(partials) == 1
    return partials[0]


# -- 1. zarr's own chunk temporaries of a killed run are not committed --------------------------------

def test_resumed_zstd_conversion_commits_no_zarr_temporary(tmp_path, npy, a):
    """zarr's LocalStore writes a chunk to ``NAME.<uuid hex>.partial`` and renames it: a SIGKILL in
    between left that file in the partial, and the resumed run committed it inside the output."""
    out = tmp_path / "o.zarr"
    partial = _kill_after(tmp_path, npy, out, 3)
    left = [partial / "c" / "7" / f"0.{uuid.uuid4().hex}.partial",  # a chunk the killed run was writing
            partial / f"zarr.{uuid.uuid4().hex}.partial"]  # a metadata write, the same way
    for f in left:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"half a chunk")
    mine = tmp_path / f"notes.{uuid.uuid4().hex}.partial"  # not in blocklin's partial: never touched
    mine.write_bytes(b"the user's")
    rep = blocklin.convert(npy, out, chunks=(16, 45), memory="48KiB", codec="zstd", resume=True)
    assert rep["blocks_skipped"] == 3
    stray = [os.path.join(r, f) for r, _, fs in os.walk(out) for f in fs if f.endswith(".partial")]
    assert stray == []
    np.testing.assert_array_equal(zarr.open_array(out)[:], a)
    assert mine.read_bytes() == b"the user's"
    blocklin.convert(npy, out, chunks=(16, 45), codec="zstd", overwrite=True)  # still blocklin's own output


# -- 2. a --resume refused for its budget: what it leaves ---------------------------------------------

def _partials(folder, name):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(f".{name}.partial-"))


def test_refused_resume_removes_the_partial_it_created(tmp_path, npy):
    """Nothing to continue: the refused run's own partial went (it had been kept, owned by no one)."""
    with pytest.raises(blocklin.errors.BudgetError, match="memory") as info:
        blocklin.convert(npy, tmp_path / "o.zarr", chunks=(16, 45), memory="4KiB", resume=True)
    assert "blocklin clean" not in str(info.value)
    assert _partials(tmp_path, "o.zarr") == [] and not (tmp_path / "o.zarr").exists()


def test_refused_resume_keeps_the_interrupted_runs_partial(tmp_path, npy, a):
    """The partial of a killed run stays for a rerun with a budget that fits, and the refusal says
    how to continue it or remove it."""
    out = tmp_path / "o.zarr"
    partial = _kill_after(tmp_path, npy, out, 3)
    chunks = sorted(p.name for p in (partial / "c").iterdir())
    with pytest.raises(blocklin.errors.BudgetError, match=r"raise the budget.*kept in partial output "
                       rf".*{partial.name}: rerun with --resume .*blocklin clean ") as info:
        blocklin.convert(npy, out, chunks=(16, 45), memory="4KiB", codec="zstd", resume=True)
    assert info.value.minimum
    assert _partials(tmp_path, "o.zarr") == [partial.name] and sorted(p.name for p in (partial / "c").iterdir()) \
        == chunks
    rep = blocklin.convert(npy, out, chunks=(16, 45), memory="48KiB", codec="zstd", resume=True)
    assert rep["blocks_skipped"] == 3
    np.testing.assert_array_equal(zarr.open_array(out)[:], a)


# -- 3. a killed run's mirror folder is swept by the next run that mirrors -----------------------------

_KILL_MIRROR = textwrap.dedent("""
    import os, signal, sys
    import blocklin
    from blocklin.storage.formats.mtx import MtxReader

    def killed(self, scratch, w):
        os.kill(os.getpid(), signal.SIGKILL)

    MtxReader._mirror_into = killed
    with blocklin.config.set(temp_dir=sys.argv[3]):
        blocklin.convert(sys.argv[1], sys.argv[2], memory="16MiB")
""")


def test_killed_mirror_folder_is_swept_by_a_later_run(tmp_path, rng):
    n = 40
    g = rng.standard_normal((n, n))
    a = np.tril(g) + np.tril(g, -1).T
    src = tmp_path / "s.mtx"
    with open(src, "w") as f:
        f.write(f"%%MatrixMarket matrix array real symmetric\n{n} {n}\n")
        f.write("".join(f"{v!r}\n" for j in range(n) for v in a[j:, j].tolist()))
    temp = tmp_path / "temp"
    temp.mkdir()
    script = tmp_path / "kill.py"
    script.write_text(_KILL_MIRROR)
    proc = subprocess.run([sys.executable, str(script), str(src), str(tmp_path / "k.npy"), str(temp)],
                          capture_output=True)
    assert proc.returncode == -9, proc.stderr.decode()
    stale = [p.name for p in temp.iterdir()]
    assert len(stale) == 1 and stale[0].startswith("blocklin-mirror-")
    with blocklin.config.set(temp_dir=str(temp)), pytest.warns(blocklin.errors.BlocklinWarning,
                                                                match=f"removed the work folder of a run that "
                                                                      f"is gone: .*{stale[0]}"):
        blocklin.convert(src, tmp_path / "s.npy", memory="16MiB")
    np.testing.assert_array_equal(np.load(tmp_path / "s.npy"), a)
    assert list(temp.iterdir()) == []


_KILL_STAGE = textwrap.dedent("""
    import os, signal, sys
    import blocklin

    class Kill:
        def start(self, total, desc): pass
        def advance(self, n=1): os.kill(os.getpid(), signal.SIGKILL)
        def close(self): pass

    with blocklin.config.set(temp_dir=sys.argv[3]):
        blocklin.convert(sys.argv[1], sys.argv[2], memory="16MiB", progress=Kill())
""")


def test_killed_stage_folder_is_owned_and_swept(tmp_path, a):
    """A CSV to Matrix Market conversion goes through a stage folder under the temp dir: it had no
    owner record, so neither a later run nor ``blocklin clean`` ever removed a killed run's."""
    np.savetxt(tmp_path / "a.csv", a, delimiter=",", fmt="%.17g")
    temp = tmp_path / "temp"
    temp.mkdir()
    script = tmp_path / "kill.py"
    script.write_text(_KILL_STAGE)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "a.csv"), str(tmp_path / "k.mtx"),
                           str(temp)], capture_output=True)
    assert proc.returncode == -9, proc.stderr.decode()
    stale = [p.name for p in temp.iterdir()]
    assert len(stale) == 1 and stale[0].startswith("blocklin-stage-")
    from blocklin.storage.cleanup import find_leftovers

    assert [i.action for i in find_leftovers([str(temp)])] == ["remove"]
    with blocklin.config.set(temp_dir=str(temp)), pytest.warns(blocklin.errors.BlocklinWarning,
                                                                match=f"gone: .*{stale[0]}"):
        assert blocklin.convert(tmp_path / "a.csv", tmp_path / "a.mtx", memory="16MiB")["staged"]
    assert list(temp.iterdir()) == []


# -- 4. a uint64 beyond int64 is not written to Matrix Market ----------------------------------------

def test_mtx_output_refuses_uint64_beyond_int64(tmp_path):
    import scipy.io
    import scipy.sparse

    x = np.arange(12, dtype=np.uint64).reshape(3, 4)
    x[2, 1] = 2**63 - 1  # the largest that fits: written and read back
    np.save(tmp_path / "ok.npy", x)
    blocklin.convert(tmp_path / "ok.npy", tmp_path / "ok.mtx")
    np.testing.assert_array_equal(scipy.io.mmread(tmp_path / "ok.mtx"), x.astype(np.int64))
    x[1, 2] = 2**63
    np.save(tmp_path / "x.npy", x)
    rule = r"dtype: Matrix Market integers must fit int64 .*; got uint64 value 9223372036854775808 at " \
           r"row {}, column {}\. Fix: pass --dtype float64"
    with pytest.raises(blocklin.errors.DTypeError, match=rule.format(2, 3)):
        blocklin.convert(tmp_path / "x.npy", tmp_path / "x.mtx")
    assert sorted(p.name for p in tmp_path.iterdir() if "x.mtx" in p.name) == []
    blocklin.convert(tmp_path / "x.npy", tmp_path / "x.mtx", dtype="float64")  # the fix it names
    # a sparse matrix exported as coordinate entries, the same way
    s = scipy.sparse.random(50, 40, density=0.1, format="csr", random_state=1, dtype=np.float64)
    s.data = np.arange(1, s.nnz + 1, dtype=np.uint64)
    s = s.astype(np.uint64)
    r, c = s.nonzero()
    s[r[7], c[7]] = 2**64 - 1
    scipy.sparse.save_npz(tmp_path / "s.npz", s)
    blocklin.convert(tmp_path / "s.npz", tmp_path / "s.zarr")
    with pytest.raises(blocklin.errors.DTypeError, match=rule.format(r[7] + 1, c[7] + 1)
                       .replace("9223372036854775808", str(2**64 - 1))):
        blocklin.convert(tmp_path / "s.zarr", tmp_path / "s.mtx")
    assert not [p.name for p in tmp_path.iterdir() if "s.mtx" in p.name]


# -- 5. an output that is the input under another name (a hard link) ---------------------------------

def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_output_hard_linked_to_the_input_is_refused(tmp_path, npy, capsys):
    """An HDF5 output is written into an existing file: through a hard link to the input that had been
    a raw OSError from h5py (or, unlocked, a dataset added to the input). Every format is refused the
    same way before anything is written."""
    h5py = pytest.importorskip("h5py")
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f["A"] = np.arange(20.0).reshape(4, 5)
    os.link(tmp_path / "in.h5", tmp_path / "out.h5")
    before = _digest(tmp_path / "in.h5")
    rule = r"out: must differ from every input \(inputs are never modified\); got '.*out\.{}', the same file " \
           r"as the input '.*in\.{}' under another name \(a hard link or a bind mount\)\. Fix: remove that name"
    with pytest.raises(blocklin.errors.OutputIsInputError, match=rule.format("h5", "h5")):
        blocklin.convert(f"{tmp_path / 'in.h5'}:/A", f"{tmp_path / 'out.h5'}:/B")
    from blocklin.cli.main import main

    assert main(["convert", f"{tmp_path / 'in.h5'}:/A", f"{tmp_path / 'out.h5'}:/B"]) != 0
    assert "OutputIsInputError" in capsys.readouterr().err
    assert _digest(tmp_path / "in.h5") == before
    with h5py.File(tmp_path / "in.h5", "r") as f:
        assert list(f) == ["A"]
    os.link(npy, tmp_path / "b.npy")
    before = _digest(npy)
    for out, kw in (("b.npy", {"overwrite": True}), ("b.npy", {})):
        with pytest.raises(blocklin.errors.OutputIsInputError, match=r"got '.*b\.npy', the same file as the "
                           r"input '.*a\.npy' under another name"):
            blocklin.convert(npy, tmp_path / out, **kw)
    assert _digest(npy) == before and os.path.samefile(npy, tmp_path / "b.npy")
    assert not [p.name for p in tmp_path.iterdir() if ".partial-" in p.name]
