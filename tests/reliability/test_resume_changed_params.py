"""A resumed run on the same input files with other reading or fold parameters, or one interrupted after its
result was written, either equals a fresh run or starts over.

Found by a randomized search over the resumable operations (interrupt, change, resume, compare bits with
a fresh run): the resume identity of ``convert`` left out how a raw file is read (its order), so a
conversion resumed with ``order="F"`` kept the blocks the interrupted run had read in C order; that of a
cross-validated ``solve`` named its splits by their count only, so a resume with splits of other bounds
reused the interrupted run's fold sums. And a run interrupted after it had written a result whole (``x``
of a least-squares solve, the factors of ``svd``) but before its commit could not be resumed: zarr
refused to create that array again in the partial output.

And the products (``matmul``, dense or sparse, its ``update``, the sparse Gram) named no output codec: one
resumed under another codec kept the interrupted run's array and committed it stored with the first codec.

Every comparison is of bits (``array_equal``): a resumed run reproduces a fresh one exactly or it is wrong.
"""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl

from support.interrupts import interrupt_after



def _partials(folder, out: str) -> list:
    return [p for p in folder.iterdir() if p.name.startswith(f".{out}.partial-")]


def test_raw_conversion_resumed_in_the_other_order_is_started_over(tmp_path, monkeypatch):
    """A raw square file converted in C order, interrupted after 12 of its 36 blocks (40 x 40: a 64 KiB
    budget makes the C- and F-order plans copy the same blocks, so their markers have the same names),
    then resumed with ``order="F"``: the result is the F-order reading of the file, as a fresh run gives
    (it had kept the 12 blocks read in C order: 30% of the entries differed)."""
    import blocklin.storage.atomic as atomic

    a = np.random.default_rng(1).standard_normal((240, 240))
    a.tofile(tmp_path / "A.bin")
    kw = {"shape": (240, 240), "dtype": "float64", "memory": "64KiB", "chunks": (40, 40)}
    interrupt_after(monkeypatch, atomic, "mark_done", 12)
    with pytest.raises(KeyboardInterrupt):
        bl.convert(tmp_path / "A.bin", tmp_path / "x.zarr", **kw)
    monkeypatch.undo()
    assert _partials(tmp_path, "x.zarr")  # the finished blocks are kept for a resume
    bl.convert(tmp_path / "A.bin", tmp_path / "x.zarr", resume=True, order="F", **kw)
    got = bl.open(tmp_path / "x.zarr").to_numpy()
    np.testing.assert_array_equal(got, a.T)  # the file's values read column by column
    assert not _partials(tmp_path, "x.zarr")


def _splits(cut: int, m: int) -> list:
    """Two contiguous folds, rows ``[0, cut)`` and ``[cut, m)``, as (training, held-out) index arrays."""
    rows = np.arange(m)
    return [(rows[cut:], rows[:cut]), (rows[:cut], rows[cut:])]


def test_cross_validated_solve_resumed_with_other_splits_is_started_over(tmp_path, monkeypatch):
    """``solve`` with ``lam=("loo", grid)`` and ``cv`` given as two contiguous splits, interrupted after its
    fold pass was recorded; resumed with splits of other bounds, it must not reuse that pass's fold sums
    (its ``x`` had differed from the fresh run's)."""
    import blocklin.linalg.solve.least_squares as ls

    rng = np.random.default_rng(0)
    m = 600
    a = bl.from_array(rng.standard_normal((m, 20)), tmp_path / "a.zarr", chunks=(100, 20))
    b = bl.from_array(rng.standard_normal((m, 1)), tmp_path / "b.zarr")
    kw = {"lam": ("loo", [1e-3, 1e-1, 1.0, 10.0, 100.0]), "memory": "256KiB", "scheduler": "sync"}
    interrupt_after(monkeypatch, ls, "solve_report", 0)  # after x is written, before the commit
    with pytest.raises(KeyboardInterrupt):
        bl.solve(a.path, b.path, out=tmp_path / "x.zarr", cv=_splits(100, m), **kw)
    monkeypatch.undo()
    assert _partials(tmp_path, "x.zarr")
    x = bl.solve(a.path, b.path, out=tmp_path / "x.zarr", cv=_splits(500, m), resume=True, **kw)
    ref = bl.solve(a.path, b.path, out=tmp_path / "ref.zarr", cv=_splits(500, m), **kw)
    assert x.report.get("resumed_passes", []) == []
    np.testing.assert_array_equal(x.to_numpy(), ref.to_numpy())


@pytest.mark.parametrize("lam", [1e-3, "gcv"])
def test_solve_interrupted_after_writing_x_resumes(tmp_path, monkeypatch, lam):
    """A least-squares solve interrupted after ``x`` was written into its partial output, before the commit:
    the resumed run continues from the recorded passes and commits the fresh run's ``x`` (it had failed
    with zarr's ``ContainsArrayError``)."""
    import blocklin.linalg.solve.least_squares as ls

    rng = np.random.default_rng(0)
    a = bl.from_array(rng.standard_normal((600, 20)), tmp_path / "a.zarr", chunks=(100, 20))
    b = bl.from_array(rng.standard_normal((600, 2)), tmp_path / "b.zarr")
    kw = {"lam": lam, "memory": "256KiB", "scheduler": "sync"}
    interrupt_after(monkeypatch, ls, "solve_report", 0)
    with pytest.raises(KeyboardInterrupt):
        bl.solve(a.path, b.path, out=tmp_path / "x.zarr", **kw)
    monkeypatch.undo()
    x = bl.solve(a.path, b.path, out=tmp_path / "x.zarr", resume=True, **kw)
    ref = bl.solve(a.path, b.path, out=tmp_path / "ref.zarr", **kw)
    assert x.report["resumed_passes"]  # the interrupted run's passes were continued, not redone
    np.testing.assert_array_equal(x.to_numpy(), ref.to_numpy())
    assert not _partials(tmp_path, "x.zarr")


def test_svd_interrupted_before_its_commit_resumes(tmp_path, monkeypatch):
    """``svd`` interrupted after writing ``U``, ``S`` and ``Vt`` into its partial group, before the commit:
    the resumed run writes them again and equals a fresh run (it had failed with ``ContainsArrayError``)."""
    import blocklin.storage.atomic as atomic

    rng = np.random.default_rng(7)
    a = bl.from_array(rng.standard_normal((240, 240)), tmp_path / "a.zarr", chunks=(40, 40))
    kw = {"k": 4, "seed": 1, "memory": "1MiB"}
    interrupt_after(monkeypatch, atomic.AtomicOutput, "commit", 0)
    with pytest.raises(KeyboardInterrupt):
        bl.svd(a.path, out=tmp_path / "f.zarr", **kw)
    monkeypatch.undo()
    assert _partials(tmp_path, "f.zarr")
    got = bl.svd(a.path, out=tmp_path / "f.zarr", resume=True, **kw)
    ref = bl.svd(a.path, out=tmp_path / "ref.zarr", **kw)
    for x, y in zip(got, ref):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert not _partials(tmp_path, "f.zarr")


@pytest.mark.parametrize("rewrite", [False, True])
def test_update_resumed_after_its_stored_result_was_rewritten(tmp_path, monkeypatch, rewrite):
    """``update`` adds the appended rows' terms to the stored result it replaces, so that result is one of its
    inputs: interrupted after 4 tiles, then (``rewrite``) two chunks of the stored Gram matrix rewritten in
    place, the resumed update equals an update of the rewritten result (it had kept the 4 tiles made from the
    old values); unchanged, it continues the interrupted run's tiles."""
    import shutil
    import warnings

    import zarr

    import blocklin.runtime.blockops as blockops

    run, fresh = tmp_path / "run", tmp_path / "fresh"
    run.mkdir()
    rng = np.random.default_rng(0)
    bl.from_array(rng.standard_normal((400, 160)), run / "A.zarr", chunks=(40, 40))
    bl.gram(run / "A.zarr", run / "G.zarr", memory="256KiB")
    bl.append(run / "A.zarr", rng.standard_normal((80, 160)))
    interrupt_after(monkeypatch, blockops, "mark_done", 4)  # the Gram tiles' markers
    with pytest.raises(KeyboardInterrupt):
        bl.update(run / "G.zarr", memory="256KiB")
    monkeypatch.undo()
    assert _partials(run, "G.zarr")
    if rewrite:
        g = zarr.open_array(str(run / "G.zarr"), mode="r+")
        g[0:40, 0:40] = g[0:40, 0:40] + 1.0
        g[120:160, 120:160] = g[120:160, 120:160] + 1.0
    shutil.copytree(run, fresh, ignore=shutil.ignore_patterns(".G.zarr.partial-*"))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = bl.update(run / "G.zarr", memory="256KiB", resume=True)
    said = [str(w.message) for w in seen if "changed since the interrupted run" in str(w.message)]
    ref = bl.update(fresh / "G.zarr", memory="256KiB")
    np.testing.assert_array_equal(got.to_numpy(), ref.to_numpy())
    if rewrite:
        assert len(said) == 1 and f"input {run / 'G.zarr'} " in said[0] and "starting over" in said[0], said
        assert got.report["skipped"] == 0
    else:
        assert said == [] and got.report["skipped"] == 4


def test_resume_with_other_arguments_names_the_interrupted_command(tmp_path, monkeypatch):
    """A ``--resume`` whose arguments give another resume identity than the interrupted run's says so: not
    "no unfinished run" alone (one was there, and was removed), but when and by which command it was
    started, the arguments that differ, and that it starts fresh; the result is the fresh run's."""
    import warnings

    import blocklin.runtime.blockops as blockops
    from blocklin.cli.main import main

    monkeypatch.chdir(tmp_path)
    bl.from_array(np.random.default_rng(3).standard_normal((240, 160)), tmp_path / "A.zarr", chunks=(40, 40))
    argv = ["gram", "A.zarr", "-o", "G.zarr", "--memory", "256KiB", "--no-progress"]
    interrupt_after(monkeypatch, blockops, "mark_done", 3)
    assert main(argv) == 130
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)  # undone with the interrupt
    assert _partials(tmp_path, "G.zarr")
    other = ["gram", "A.zarr", "-o", "G.zarr", "--memory", "256KiB", "--dtype", "float32", "--no-progress"]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert main(other + ["--resume"]) == 0
    err = "\n".join(str(w.message) for w in seen)
    said = [ln for ln in err.splitlines() if "resume:" in ln]
    assert len(said) == 1, err
    assert "to continue with these arguments" in said[0] and "starting fresh" in said[0]
    assert f"by `blocklin {' '.join(argv)}`" in said[0]
    assert "nothing then, `--dtype float32` now" in said[0]
    assert "removed the partial output of an interrupted run with other arguments" in err
    assert main(["gram", "A.zarr", "-o", "F.zarr", "--memory", "256KiB", "--dtype", "float32", "--no-progress"]) == 0
    np.testing.assert_array_equal(bl.open(tmp_path / "G.zarr").to_numpy(), bl.open(tmp_path / "F.zarr").to_numpy())


def test_svd_resumed_with_other_workers_is_started_over(tmp_path, monkeypatch):
    """``svd``'s passes split their partial sums by the workers (each run's bits are the same for a given
    count, and another count gives others, about 1e-13 apart): a run interrupted after 10 Lanczos
    checkpoints with ``workers=1`` and resumed with ``workers=2`` must give the bits of a fresh run with 2
    (it had continued the checkpoints and given bits of neither)."""
    from blocklin.runtime.checkpoints import Checkpoints

    a = bl.from_array(np.random.default_rng(7).standard_normal((240, 240)), tmp_path / "a.zarr", chunks=(40, 40))
    kw = {"k": 4, "seed": 1, "memory": "1MiB", "method": "lanczos"}
    interrupt_after(monkeypatch, Checkpoints, "save", 10)
    with pytest.raises(KeyboardInterrupt):
        bl.svd(a.path, out=tmp_path / "f.zarr", workers=1, **kw)
    monkeypatch.undo()
    assert _partials(tmp_path, "f.zarr")
    got = bl.svd(a.path, out=tmp_path / "f.zarr", resume=True, workers=2, **kw)
    ref = bl.svd(a.path, out=tmp_path / "ref.zarr", workers=2, **kw)
    for x, y in zip(got, ref):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert got.report["restored_checkpoints"] == []


@pytest.mark.parametrize("method", ["normal", "qr"])
def test_least_squares_resumed_with_other_workers_is_started_over(tmp_path, monkeypatch, method):
    """The least-squares passes (Gram, TSQR) add their row blocks' sums in an order set by the workers: one
    recorded with ``workers=1`` must not be reused by a resume with ``workers=2``, whose fresh ``x`` has
    other last bits (it had been, and ``x`` equalled neither run's)."""
    import blocklin.linalg.solve.least_squares as ls

    rng = np.random.default_rng(0)
    a = bl.from_array(rng.standard_normal((3000, 20)), tmp_path / "a.zarr", chunks=(100, 20))
    b = bl.from_array(rng.standard_normal((3000, 2)), tmp_path / "b.zarr")
    kw = {"lam": 1e-3, "memory": "256KiB", "method": method}
    interrupt_after(monkeypatch, ls, "solve_report", 0)
    with pytest.raises(KeyboardInterrupt):
        bl.solve(a.path, b.path, out=tmp_path / "x.zarr", workers=1, **kw)
    monkeypatch.undo()
    x = bl.solve(a.path, b.path, out=tmp_path / "x.zarr", resume=True, workers=2, **kw)
    ref = bl.solve(a.path, b.path, out=tmp_path / "ref.zarr", workers=2, **kw)
    np.testing.assert_array_equal(x.to_numpy(), ref.to_numpy())
    assert x.report["resumed_passes"] == []


@pytest.mark.parametrize("operation", ["gram", "update"])
def test_gram_tiles_resumed_on_another_device_are_started_over(tmp_path, monkeypatch, standin, operation):
    """The Gram's tiled route runs each SYRK tile on the job's device (cuBLAS and the CPU BLAS round
    differently), and its plan names no device: a run interrupted after 4 tiles on the CPU and resumed with
    ``device="gpu"`` must start over and give the fresh GPU run's bits (it had kept the 4 CPU tiles, which no
    run on one device gives). ``operation``: a Gram written afresh, or brought up to date (``update``)."""
    import shutil

    import blocklin.runtime.blockops as blockops

    run, fresh = tmp_path / "run", tmp_path / "fresh"
    run.mkdir()
    rng = np.random.default_rng(0)
    bl.from_array(rng.standard_normal((400, 160)), run / "A.zarr", chunks=(40, 40))
    kw = {"memory": "256KiB"}
    if operation == "update":
        bl.gram(run / "A.zarr", run / "G.zarr", **kw)
        bl.append(run / "A.zarr", rng.standard_normal((80, 160)))
    shutil.copytree(run, fresh)

    def go(folder, **more):
        if operation == "update":
            return bl.update(folder / "G.zarr", **kw, **more)
        return bl.gram(folder / "A.zarr", folder / "G.zarr", **kw, **more)

    interrupt_after(monkeypatch, blockops, "mark_done", 4)  # the Gram tiles' markers
    with pytest.raises(KeyboardInterrupt):
        go(run, device="cpu")
    monkeypatch.undo()
    assert _partials(run, "G.zarr")
    got = go(run, device="gpu", resume=True)
    ref = go(fresh, device="gpu")
    assert ref.report["route"] == "tiles"
    assert got.report["skipped"] == 0
    np.testing.assert_array_equal(got.to_numpy(), ref.to_numpy())


@pytest.mark.parametrize("operation", ["cholesky", "lu", "qr"])
def test_factor_tiles_resumed_on_another_device_are_started_over(tmp_path, monkeypatch, standin, operation):
    """The tiled Cholesky, LU and QR update their tiles on the job's device and their plan names no device: a
    factorization interrupted after 4 tiles on the CPU and resumed with ``device="gpu"`` must start over
    (it had kept the CPU tiles, and the trailing tiles computed from them on the GPU, a mixture no run on
    one device gives)."""
    import blocklin.runtime.blockops as blockops

    rng = np.random.default_rng(2)
    x = rng.standard_normal((240, 240))
    a = bl.from_array(x @ x.T + 240 * np.eye(240), tmp_path / "a.zarr", chunks=(40, 40))
    factor = getattr(bl, operation)
    kw = {"tile": 40, "memory": "1MiB", "scheduler": "sync"} | ({"method": "tiled"} if operation == "qr" else {})
    interrupt_after(monkeypatch, blockops, "mark_done", 4)
    with pytest.raises(KeyboardInterrupt):
        factor(a.path, tmp_path / "f.zarr", device="cpu", **kw)
    monkeypatch.undo()
    assert _partials(tmp_path, "f.zarr")
    got = factor(a.path, tmp_path / "f.zarr", device="gpu", resume=True, **kw)
    ref = factor(a.path, tmp_path / "ref.zarr", device="gpu", **kw)
    assert not got.report.get("skipped")
    np.testing.assert_array_equal(got.to_numpy(), ref.to_numpy())


@pytest.mark.parametrize("where", ["cluster", "local"])
def test_runs_interrupted_on_a_cluster_resume_there_or_locally(tmp_path, monkeypatch, client, where):
    """An ``svd`` (Lanczos checkpoints) and a least-squares ``solve`` (recorded passes) interrupted on the
    two-process ``LocalCluster`` of one task thread per worker (the cluster whose bits docs/engine.md,
    "Determinism", promises equal to a local run's), resumed on it or locally with the default settings:
    each gives the bits of a fresh run where it is resumed, and on the cluster continues the interrupted
    run's work. (A cluster of worker threads in the client's process, ``processes=False``, gave other bits
    from one fresh run to the next with two OpenBLAS threads: no resume can match those.)"""
    import blocklin.linalg.solve.least_squares as ls
    from blocklin.runtime.checkpoints import Checkpoints

    rng = np.random.default_rng(7)
    a = bl.from_array(rng.standard_normal((240, 240)), tmp_path / "a.zarr", chunks=(40, 40))
    la = bl.from_array(rng.standard_normal((3000, 20)), tmp_path / "la.zarr", chunks=(100, 20))
    lb = bl.from_array(rng.standard_normal((3000, 2)), tmp_path / "lb.zarr")
    skw = {"k": 4, "seed": 1, "memory": "1MiB", "method": "lanczos"}
    qkw = {"lam": 1e-3, "memory": "256KiB", "method": "normal"}
    on = {"scheduler": client} if where == "cluster" else {}
    interrupt_after(monkeypatch, Checkpoints, "save", 10)
    with pytest.raises(KeyboardInterrupt):
        bl.svd(a.path, out=tmp_path / "f.zarr", scheduler=client, **skw)
    interrupt_after(monkeypatch, ls, "solve_report", 0)
    with pytest.raises(KeyboardInterrupt):
        bl.solve(la.path, lb.path, out=tmp_path / "x.zarr", scheduler=client, **qkw)
    monkeypatch.undo()
    got = bl.svd(a.path, out=tmp_path / "f.zarr", resume=True, **skw, **on)
    ref = bl.svd(a.path, out=tmp_path / "g.zarr", **skw, **on)
    x = bl.solve(la.path, lb.path, out=tmp_path / "x.zarr", resume=True, **qkw, **on)
    y = bl.solve(la.path, lb.path, out=tmp_path / "y.zarr", **qkw, **on)
    if where == "cluster":
        assert got.report["restored_checkpoints"] and x.report["resumed_passes"]
    for u, v in zip(got, ref):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
    np.testing.assert_array_equal(x.to_numpy(), y.to_numpy())


def _twins(tmp_path, setup):
    """Folders ``run`` and ``fresh`` holding the same inputs (``setup(run)``, then copied); returns both and what
    ``setup`` returned."""
    import shutil

    run, fresh = tmp_path / "run", tmp_path / "fresh"
    run.mkdir()
    made = setup(run)
    shutil.copytree(run, fresh)
    return run, fresh, made


def _interrupted_before_commit(patch, call, **config) -> None:
    """``call()`` under ``bl.config.set(**config)``, interrupted (KeyboardInterrupt) just before its output's
    commit; the interrupt stays set in ``patch`` (a monkeypatch: undo it, or leave its context)."""
    import blocklin.storage.atomic as atomic

    interrupt_after(patch, atomic.AtomicOutput, "commit", 0)
    with bl.config.set(**config), pytest.raises(KeyboardInterrupt):
        call()


def _codec(path) -> str:
    """The compression of the zarr array at ``path``, as its metadata names it."""
    import zarr

    from blocklin.storage.zarr_store import describe_codecs

    return describe_codecs(zarr.open_array(str(path), mode="r"))


def _sparse_product_inputs(folder) -> None:
    """A stored 400 x 300 sparse ``S`` (5% of its entries) and a dense 300 x 40 ``B`` under ``folder``."""
    import scipy.sparse as sp

    bl.from_sparse(sp.random(400, 300, density=0.05, random_state=1, format="csr"), folder / "S.zarr")
    bl.from_array(np.random.default_rng(0).standard_normal((300, 40)), folder / "B.zarr", chunks=(60, 40))


def _codec_case(operation: str, folder):
    """Inputs under ``folder`` for ``operation`` and the call that writes its output ``R.zarr`` there."""
    rng = np.random.default_rng(0)
    if operation == "matmul":
        bl.from_array(rng.standard_normal((256, 192)), folder / "A.zarr", chunks=(32, 32))
        bl.from_array(rng.standard_normal((192, 160)), folder / "B.zarr", chunks=(32, 32))
        return lambda f, **kw: bl.matmul(f / "A.zarr", f / "B.zarr", f / "R.zarr", memory="96KiB", **kw)
    if operation == "matmul-update":
        bl.from_array(rng.standard_normal((400, 40)), folder / "A.zarr", chunks=(40, 40))
        bl.from_array(rng.standard_normal((400, 2)), folder / "B.zarr", chunks=(40, 2))
        bl.matmul(folder / "A.zarr", folder / "B.zarr", folder / "R.zarr", trans_a=True, memory="96KiB")
        bl.append(folder / "A.zarr", rng.standard_normal((120, 40)))
        bl.append(folder / "B.zarr", rng.standard_normal((120, 2)))
        return lambda f, **kw: bl.update(f / "R.zarr", memory="96KiB", **kw)
    _sparse_product_inputs(folder)
    if operation == "sparse-matmul":
        return lambda f, **kw: bl.matmul(f / "S.zarr", f / "B.zarr", f / "R.zarr", memory="1MiB", **kw)
    return lambda f, **kw: bl.gram(f / "S.zarr", f / "R.zarr", memory="4MiB", **kw)  # sparse-gram


@pytest.mark.parametrize("operation", ["matmul", "matmul-update", "sparse-matmul", "sparse-gram"])
def test_product_resumed_with_another_codec_is_started_over(tmp_path, monkeypatch, operation):
    """The output codec (``codec`` of the config, ``BLOCKLIN_CODEC``) is no part of these products' plans,
    and a resumed run writes into the array the interrupted one created: a run interrupted just before its
    commit under ``codec="gzip"`` and resumed under ``"zstd"`` must start over and store its result with
    zstd, as a fresh run does (it had kept every tile and committed a gzip array, no word said). Both codecs
    compress, so the dense product's plan (direct chunk writes only without one) is the same for both."""
    run, fresh, go = _twins(tmp_path, lambda f: _codec_case(operation, f))
    _interrupted_before_commit(monkeypatch, lambda: go(run), codec="gzip")
    monkeypatch.undo()
    assert _partials(run, "R.zarr")
    with bl.config.set(codec="zstd"):
        got = go(run, resume=True)
        ref = go(fresh)
    assert got.report["skipped"] == 0
    assert _codec(run / "R.zarr") == _codec(fresh / "R.zarr") == "zstd"
    np.testing.assert_array_equal(got.to_numpy(), ref.to_numpy())
    assert not _partials(run, "R.zarr")


def test_resumed_array_of_another_codec_is_created_again(tmp_path, monkeypatch):
    """The second line of defence: where a token missed the codec (the matmul's token without the job's
    settings, as it had been), the resumed run finds the interrupted one's array stored with another codec
    and creates it again (``atomic.open_or_create_array``), rather than committing it."""
    import blocklin.linalg.products.gemm as gemm

    run, fresh, go = _twins(tmp_path, lambda f: _codec_case("matmul", f))
    monkeypatch.setattr(gemm, "plan_settings", lambda job: ())
    with monkeypatch.context() as m:
        _interrupted_before_commit(m, lambda: go(run), codec="gzip")
    with bl.config.set(codec="zstd"):
        got = go(run, resume=True)
        ref = go(fresh)
    assert got.report["skipped"] == 0
    assert _codec(run / "R.zarr") == _codec(fresh / "R.zarr") == "zstd"
    np.testing.assert_array_equal(got.to_numpy(), ref.to_numpy())


def _layout_case(operation: str, folder):
    """Inputs under ``folder`` for ``operation`` and the call that writes its output ``R.zarr`` there
    (dense products and factors of a 240 x 240 or 256 x 192 input in 40- or 32-wide chunks)."""
    rng = np.random.default_rng(2)
    if operation in ("matmul", "gram"):
        bl.from_array(rng.standard_normal((256, 192)), folder / "A.zarr", chunks=(32, 32))
        bl.from_array(rng.standard_normal((192, 160)), folder / "B.zarr", chunks=(32, 32))
        if operation == "gram":
            return lambda f, **kw: bl.gram(f / "A.zarr", f / "R.zarr", memory="256KiB", **kw)
        return lambda f, **kw: bl.matmul(f / "A.zarr", f / "B.zarr", f / "R.zarr", memory="96KiB", **kw)
    if operation.startswith("sparse"):
        _sparse_product_inputs(folder)
        if operation == "sparse-matmul":
            return lambda f, **kw: bl.matmul(f / "S.zarr", f / "B.zarr", f / "R.zarr", memory="1MiB", **kw)
        return lambda f, **kw: bl.gram(f / "S.zarr", f / "R.zarr", memory="4MiB", **kw)
    x = rng.standard_normal((240, 240))
    if operation == "convert":
        np.save(folder / "A.npy", x)
        return lambda f, **kw: bl.convert(f / "A.npy", f / "R.zarr", memory="128KiB", **kw)
    bl.from_array(x @ x.T + 240 * np.eye(240), folder / "A.zarr", chunks=(40, 40))
    factor = getattr(bl, operation)
    more = {"method": "tiled"} if operation == "qr" else {}
    return lambda f, **kw: factor(f / "A.zarr", f / "R.zarr", memory="1MiB", scheduler="sync", **more, **kw)


@pytest.mark.parametrize("operation,first,second", [
    pytest.param("matmul", {"out_chunks": (32, 32)}, {"out_chunks": (64, 64)}, id="matmul-chunks"),
    pytest.param("matmul", {}, {"dtype": "float32"}, id="matmul-dtype"),
    pytest.param("gram", {}, {"dtype": "float32"}, id="gram-dtype"),
    pytest.param("sparse-matmul", {}, {"dtype": "float32"}, id="sparse-matmul-dtype"),
    pytest.param("sparse-gram", {}, {"dtype": "float32"}, id="sparse-gram-dtype"),
    pytest.param("convert", {"chunks": (40, 40)}, {"chunks": (60, 60)}, id="convert-chunks"),
    pytest.param("convert", {"chunks": (40, 40)}, {"chunks": (40, 40), "dtype": "float32"}, id="convert-dtype"),
    pytest.param("cholesky", {"tile": 40}, {"tile": 80}, id="cholesky-tile"),
    pytest.param("lu", {"tile": 40}, {"tile": 80}, id="lu-tile"),
    pytest.param("qr", {"tile": 40}, {"tile": 80}, id="qr-tile"),
])
def test_resumed_with_other_output_chunks_or_dtype_is_started_over(tmp_path, monkeypatch, operation, first, second):
    """A run interrupted just before its commit and resumed with other output chunks (``out_chunks``,
    convert's ``chunks``, a factor's ``tile``) or another output ``dtype`` gives the fresh run's output,
    of its chunks, dtype and bits, and reuses nothing of the interrupted run."""
    import zarr

    run, fresh, go = _twins(tmp_path, lambda f: _layout_case(operation, f))
    _interrupted_before_commit(monkeypatch, lambda: go(run, **first))
    monkeypatch.undo()
    assert _partials(run, "R.zarr")
    got = go(run, resume=True, **second)
    go(fresh, **second)
    assert not _partials(run, "R.zarr")
    mine, ref = zarr.open(str(run / "R.zarr"), mode="r"), zarr.open(str(fresh / "R.zarr"), mode="r")
    if isinstance(ref, zarr.Group):  # a factor's group: L, or L U and the pivots, or R
        mine, ref = dict(mine.arrays()), dict(ref.arrays())
    else:
        mine, ref = {"": mine}, {"": ref}
    assert sorted(mine) == sorted(ref)
    for name, y in ref.items():
        x = mine[name]
        assert (x.dtype, x.chunks) == (y.dtype, y.chunks), name
        np.testing.assert_array_equal(x[...], y[...])
    report = got if isinstance(got, dict) else got.report
    assert not report.get("skipped", report.get("blocks_skipped")), report


def _stored_update_case(kind: str, folder):
    """An updatable result ``R.zarr`` of a 400 x 40 ``A`` (and 400 x 2 ``B``) under ``folder``, then 120 rows
    appended to each: what ``update`` brings up to date. Returns the budget its update needs."""
    rng = np.random.default_rng(0)
    bl.from_array(rng.standard_normal((400, 40)), folder / "A.zarr", chunks=(40, 40))
    bl.from_array(rng.standard_normal((400, 2)), folder / "B.zarr", chunks=(40, 2))
    if kind == "qr":
        bl.qr(folder / "A.zarr", folder / "R.zarr")
    elif kind == "svd":
        bl.svd(folder / "A.zarr", 3, out=folder / "R.zarr", updatable=True, seed=0)
    elif kind == "sketch":
        bl.svd(folder / "A.zarr", 3, method="sketch", seed=0, out=folder / "R.zarr", updatable=True)
    else:
        bl.solve(folder / "A.zarr", folder / "B.zarr", lam=0.1, out=folder / "R.zarr", updatable=True)
    bl.append(folder / "A.zarr", rng.standard_normal((120, 40)))
    bl.append(folder / "B.zarr", rng.standard_normal((120, 2)))
    return "512KiB" if kind == "qr" else "1MiB"


@pytest.mark.parametrize("kind", ["qr", "svd", "sketch", "solve"])
def test_update_resumed_with_other_settings_equals_a_fresh_update(tmp_path, monkeypatch, kind):
    """The QR, SVD, sketch and solve updates compute the appended rows' terms before they claim the output,
    and a resumed one writes every array of it again (their tokens name no plan settings, and keep nothing
    that depends on them): interrupted just before the commit with ``workers=1`` under ``codec="gzip"`` and
    resumed with ``workers=2`` under ``"zstd"``, each equals a fresh update with the latter, in bits and
    in the codec of its long arrays."""
    import zarr

    run, fresh, memory = _twins(tmp_path, lambda f: _stored_update_case(kind, f))
    _interrupted_before_commit(monkeypatch, lambda: bl.update(run / "R.zarr", memory=memory, workers=1), codec="gzip")
    monkeypatch.undo()
    assert _partials(run, "R.zarr")
    with bl.config.set(codec="zstd"):
        bl.update(run / "R.zarr", memory=memory, workers=2, resume=True)
        bl.update(fresh / "R.zarr", memory=memory, workers=2)
    mine, ref = zarr.open(str(run / "R.zarr"), mode="r"), zarr.open(str(fresh / "R.zarr"), mode="r")
    mine, ref = ({"": mine}, {"": ref}) if isinstance(ref, zarr.Array) else (dict(mine.arrays()), dict(ref.arrays()))
    assert sorted(mine) == sorted(ref)
    for name, y in ref.items():
        np.testing.assert_array_equal(mine[name][...], y[...])
        assert _codec(run / "R.zarr" / name) == _codec(fresh / "R.zarr" / name), name
