"""A stored sparse matrix (a ``blocklin-csr`` group) rewritten while a run reads it.

A run had stamped a stored sparse matrix only at its first product (``sparse_pass.sparse_product``):
what it read before (the group's attributes and ``row_blocks`` when the operation opened it, the
``indptr`` scans of its plan, ``pca``'s pass of column means), a ``norm``, which runs no product, a
sparse ``matmul`` or ``gram`` returned in memory, and the products of an operator from
``aslinearoperator`` (sparse or dense) went unchecked: a value of no version was returned without a
word. The handle (:class:`blocklin.SparseMatrix`) now stamps the group when it is opened, before its
first read, and every run that reads through it takes that stamp (``input_guard.RunInputs``) and
lists the group again before its value is returned. The stamp lists every file of the group: the
``indptr``, ``indices``, ``data`` and ``row_blocks`` arrays and the group's ``zarr.json``.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse
import zarr

import blocklin
import blocklin.device.stream as stream
from blocklin.errors import InputChangedError
from blocklin.storage import sparse as stored_sparse
from blocklin.storage.sparse import SparseWriter
from support.listings import count_listings

N = 240
CHANGED = r"S\.zarr changed during the run "
#: a handle held across a rewrite: refused before the run reads through it, with the fix (a new handle)
STALE = r"S\.zarr changed since its handle was opened, before this run .*open \S*S\.zarr again \(blocklin\.open"
EPS = np.finfo(np.float64).eps


def _matrix(seed: int = 1) -> scipy.sparse.csr_matrix:
    s = scipy.sparse.random(N, N, density=0.05, format="csr", random_state=seed)
    return (s + s.T).tocsr()


@pytest.fixture
def path(tmp_path):
    p, x = tmp_path / "S.zarr", _matrix()
    w = SparseWriter(p, x.shape, x.dtype, entry_chunk=64, row_chunk=64)
    for r0 in range(0, N, 40):  # row blocks of 40 rows, as the conversion cuts them at a small budget
        blk = x[r0:r0 + 40]
        w.write_rows(r0, r0 + blk.shape[0], blk.indptr.astype(np.int64), blk.indices, blk.data)
    w.commit()
    assert blocklin.open(p).n_blocks == N // 40
    return p


def _rewrite(path, part: str = "data") -> None:
    """Another program's write in place: the values (``data``), the structure (``indptr``, ``indices``),
    or the group's attributes (its ``zarr.json``)."""
    if part in ("shape", "nnz"):  # the group's attributes: a column more, or entries fewer (no chunk file)
        g = zarr.open_group(str(path), mode="r+")
        g.attrs[part] = [N, N + 1] if part == "shape" else int(g.attrs["nnz"]) - 10
        return
    a = zarr.open_array(str(path / part), mode="r+")
    if part == "data":
        a[...] = a[...] * 7 + 1
    elif part == "indices":
        a[...] = (a[...] + 1) % N
    else:  # indptr: the first row takes the second's entries
        v = a[...]
        v[1] = v[2]
        a[...] = v


def _rewrite_after_reads(monkeypatch, path, reads: int = 1, part: str = "data") -> list:
    """Rewrite ``part`` of ``path`` once the run has read ``reads`` row ranges."""
    real, seen = stored_sparse.SparseStore.read_rows, []

    def read_then_rewrite(self, r0, r1):
        out = real(self, r0, r1)
        seen.append(1)
        if len(seen) == reads:
            _rewrite(path, part)
        return out

    monkeypatch.setattr(stored_sparse.SparseStore, "read_rows", read_then_rewrite)
    return seen


@pytest.mark.parametrize("part", ["data", "indices", "indptr", "shape", "nnz"])
def test_a_sparse_norm_of_a_group_rewritten_mid_read_is_refused(path, monkeypatch, part):
    """``norm(S)`` reads the row blocks once and runs no product: its value had been returned, the norm
    of old blocks and new ones. Each array of the group and its attributes are covered: ``nnz`` rewritten
    alone (shape and chunk files kept) had passed as an append of no rows."""
    seen = _rewrite_after_reads(monkeypatch, path, 1, part)
    with pytest.raises(InputChangedError, match=CHANGED + r".*the norm result was not returned"):
        blocklin.norm(path)
    assert len(seen) >= 2  # the run read on after the rewrite


def test_an_svd_of_a_group_rewritten_after_its_open_is_refused(path, monkeypatch):
    """The group's attributes and ``row_blocks`` are read when the operation opens it, before its run
    stamped it (at its output's claim or its first product): ``indptr`` rewritten in between was read
    against the row blocks and entry count of the old one, and the singular values returned."""
    from blocklin.linalg.lowrank import svd as svd_module

    real, seen = svd_module.operator_options, []

    def options_then_rewrite(*args, **kw):
        out = real(*args, **kw)
        seen.append(1)
        _rewrite(path, "indptr")
        return out

    monkeypatch.setattr(svd_module, "operator_options", options_then_rewrite)
    with pytest.raises(InputChangedError, match=CHANGED):
        blocklin.svd(path, 3, return_singular_vectors=False, seed=0, scheduler="sync")
    assert seen


def test_a_sparse_pca_of_a_group_rewritten_during_its_means_is_refused(path, monkeypatch):
    """``pca(S)`` centers by column means from a pass made before its SVD's run opened: means of the old
    values and products of the new ones had been returned."""
    import blocklin.linalg.lowrank.sparse_pca as sparse_pca

    real = sparse_pca.sparse_moments

    def moments_then_rewrite(s):
        out = real(s)
        _rewrite(path)
        return out

    monkeypatch.setattr(sparse_pca, "sparse_moments", moments_then_rewrite)
    with pytest.raises(InputChangedError, match=CHANGED):
        blocklin.pca(path, 2, scheduler="sync")


@pytest.mark.parametrize("op", ["matmul", "gram"])
def test_a_sparse_product_of_a_group_rewritten_before_its_output_is_claimed_is_refused(path, monkeypatch, op):
    """``matmul(S, B)`` and ``gram(S)`` had stamped ``S`` only when their output (the temporary result of a
    product returned in memory) was claimed, after their plan read the group: a rewrite in between
    went unseen."""
    from blocklin.linalg.products import sparse_gemm

    real, seen = sparse_gemm.plan_sparse, []

    def plan_then_rewrite(*args, **kw):
        out = real(*args, **kw)
        seen.append(1)
        if len(seen) == 1:
            _rewrite(path)
        return out

    monkeypatch.setattr(sparse_gemm, "plan_sparse", plan_then_rewrite)
    with pytest.raises(InputChangedError, match=r"S\.zarr changed during the run"):
        if op == "matmul":
            blocklin.matmul(path, np.ones((N, 3)), memory="4MiB", scheduler="sync")
        else:
            blocklin.gram(path, memory="4MiB", scheduler="sync")
    assert seen


def test_products_of_a_sparse_operator_over_a_rewritten_group_are_refused(path, monkeypatch):
    """``SparseMatrix.aslinearoperator()`` outside an operation: each product reads the row blocks, and a
    SciPy solver's products are one matrix's only while the group holds still. A rewrite during a
    product, or between two, had been used."""
    op = blocklin.open(path).aslinearoperator()
    x = np.ones(N)
    want = _matrix() @ x
    np.testing.assert_allclose(op @ x, want, rtol=0, atol=N * EPS * (abs(_matrix()) @ np.abs(x)).max())
    _rewrite_after_reads(monkeypatch, path, 1)
    with pytest.raises(InputChangedError, match=CHANGED):
        op @ x
    with pytest.raises(InputChangedError, match=STALE):  # and every later product, the next solver step
        op.rmatvec(x)


def test_products_of_a_dense_operator_over_a_rewritten_array_are_refused(tmp_path, monkeypatch):
    """``blocklin.aslinearoperator(A.zarr)``: each product is a row pass of its own run, which had stamped
    nothing (the operand was opened when the operator was made): ``A`` rewritten after a pass's second
    strip gave a product of both versions; rewritten between products, a solver's steps of two matrices."""
    a = tmp_path / "A.zarr"
    rng = np.random.default_rng(3)
    blocklin.from_array(rng.standard_normal((N, 40)), a, chunks=(40, 40))
    op = blocklin.aslinearoperator(a, memory="256KiB", scheduler="sync")
    x = np.ones(40)
    ref = zarr.open_array(str(a))[...]
    np.testing.assert_allclose(op @ x, ref @ x, rtol=0, atol=40 * EPS * (np.abs(ref) @ np.abs(x)).max())
    blocklin.append(a, rng.standard_normal((40, 40)))  # rows appended between products: the rows it opened
    np.testing.assert_allclose(op @ x, ref @ x, rtol=0, atol=40 * EPS * (np.abs(ref) @ np.abs(x)).max())
    zarr.open_array(str(a), mode="r+")[:N] = rng.standard_normal((N, 40))  # rewritten between two products
    with pytest.raises(InputChangedError, match=r"A\.zarr changed during the run .*was not returned"):
        op @ x

    b = tmp_path / "B.zarr"
    blocklin.from_array(rng.standard_normal((10 * N, 40)), b, chunks=(40, 40))  # several strips
    op = blocklin.aslinearoperator(b, memory="256KiB", scheduler="sync")
    real, seen = stream.check_cancelled, []

    def tick():
        seen.append(1)
        if len(seen) == 2:
            zarr.open_array(str(b), mode="r+")[...] = rng.standard_normal((10 * N, 40))
        real()

    monkeypatch.setattr(stream, "check_cancelled", tick)
    with pytest.raises(InputChangedError, match=r"B\.zarr changed during the run .*was not returned"):
        op.rmatvec(np.ones(10 * N))
    assert len(seen) >= 2


@pytest.mark.parametrize("read", ["to_scipy", "np.sum"])
def test_the_whole_matrix_of_a_handle_whose_group_was_rewritten_is_refused(path, read):
    """``S.to_scipy()``, ``S.toarray()`` and the NumPy functions that run on it read the group with the
    row blocks and entry count the handle read at its open: ``indptr`` rewritten since had been read
    against them and the matrix returned."""
    s = blocklin.open(path)
    _rewrite(path, "indptr")
    with pytest.raises(InputChangedError, match=STALE):
        s.to_scipy() if read == "to_scipy" else np.sum(s)


def test_a_held_handle_says_whether_its_group_changed_before_the_run_or_during_it(path, monkeypatch):
    """A handle held across a rewrite of its group is refused by every later run reading through it; the
    error had said the input "changed during the run", though it changed after the handle's open, before
    the run, and rerunning could never pass. It now says so and names the fix (a new handle), and a
    rewrite during a run through a held handle keeps the during-the-run wording."""
    held = blocklin.open(path)
    assert blocklin.norm(held) == pytest.approx(scipy.sparse.linalg.norm(_matrix()), rel=N * EPS)
    seen = _rewrite_after_reads(monkeypatch, path, 1)
    with pytest.raises(InputChangedError, match=CHANGED + r".*the norm result was not returned"):
        blocklin.norm(held)  # the group held still until this run read it
    assert len(seen) >= 2
    monkeypatch.undo()
    for run in (lambda: blocklin.norm(held), held.to_scipy, lambda: blocklin.gram(held, scheduler="sync")):
        with pytest.raises(InputChangedError, match=STALE):
            run()
    fresh = blocklin.open(path)  # the fix the message names
    want = zarr.open_array(str(path / "data"))[...]
    assert np.array_equal(fresh.to_scipy().data, want)


def test_rows_appended_before_or_during_a_run_pass(path, monkeypatch):
    """Appends are the one change a run may meet (as for a dense input): a handle opened before an
    append reads the version it opened, a path opened after it the grown one, and rows appended while a
    run reads pass with the version the run opened."""
    old = _matrix()
    new = scipy.sparse.random(40, N, density=0.05, format="csr", random_state=2)
    grown = scipy.sparse.vstack([old, new]).tocsr()
    held = blocklin.open(path)
    blocklin.append(path, new)
    fro = scipy.sparse.linalg.norm
    assert blocklin.norm(held) == pytest.approx(fro(old), rel=N * EPS)
    assert (held.to_scipy() != old).nnz == 0  # the rows it opened, bit for bit
    assert blocklin.norm(path) == pytest.approx(fro(grown), rel=N * EPS)

    real, seen = stored_sparse.SparseStore.read_rows, []
    more = scipy.sparse.random(40, N, density=0.05, format="csr", random_state=3)

    def read_then_append(self, r0, r1):
        out = real(self, r0, r1)
        seen.append(1)
        if len(seen) == 1:
            blocklin.append(path, more)
        return out

    monkeypatch.setattr(stored_sparse.SparseStore, "read_rows", read_then_append)
    assert blocklin.norm(path) == pytest.approx(fro(grown), rel=N * EPS)
    assert blocklin.open(path).shape == (N + 80, N)


def test_a_sparse_input_is_listed_once_at_its_open_and_once_before_the_value_returns(path, monkeypatch):
    """Cost: the handle's listing when the operation opens the group, one before the value returns."""
    listed = count_listings(monkeypatch)
    blocklin.svd(path, 2, return_singular_vectors=False, seed=0)
    assert listed.count(str(path)) == 2, listed
    listed.clear()
    blocklin.norm(path)
    assert listed.count(str(path)) == 2, listed


def _opened_by(monkeypatch, module) -> list:
    """The handles ``module``'s operations open from a path (``as_sparse_matrix``), kept for a later use."""
    real, kept = module.as_sparse_matrix, []

    def keeping(*args, **kwargs):
        kept.append(real(*args, **kwargs))
        return kept[-1]

    monkeypatch.setattr(module, "as_sparse_matrix", keeping)
    return kept


@pytest.mark.parametrize("call", ["plan", "refused svd", "operator"])
def test_a_handle_an_operation_opened_without_running_says_its_group_changed_before_a_later_run(path, monkeypatch,
                                                                                                call):
    """An operation that opens a path takes the handle's stamp for its own run without listing the group
    again. That had been a flag left on the handle's stamp until a run took it: a handle opened by a call
    that ran nothing with it (a plan explained, a call refused before its run, ``as_sparse_operator``'s
    operator before its first product) passed its next run unchecked, and a rewrite after its open was
    reported as made "during the run" of a later product (rerunning it could never pass). The own open
    is now the operation's word when it stamps the handle, and a handle used later is checked as any."""
    import blocklin.linalg.lowrank.sparse_plan as sparse_plan
    import blocklin.linalg.lowrank.svd as svd_module
    from blocklin.linalg.lowrank.sparse_plan import sparse_lowrank_plan
    from blocklin.sparse import as_sparse_operator

    if call == "operator":
        op = as_sparse_operator(str(path))
        _rewrite(path)
        with pytest.raises(InputChangedError, match=STALE):
            op.matvec(np.ones(N))
        return
    kept = _opened_by(monkeypatch, sparse_plan if call == "plan" else svd_module)
    if call == "plan":
        sparse_lowrank_plan(path, 2)
    else:
        with pytest.raises(blocklin.errors.ParameterError, match="must be an integer"):
            blocklin.svd(path, None)
    (held,) = kept
    _rewrite(path)
    with pytest.raises(InputChangedError, match=STALE):
        blocklin.norm(held)


def test_a_run_through_a_held_handle_reads_the_version_it_covers_once(path, monkeypatch):
    """Cost: the version a run covers (``versions.coverage``: reads of the group's metadata, GETs on an
    object store) is found once per run through a held handle. The check of the handle had found it too
    where the group was unchanged since the open, and needed it only for a changed one (rows appended)."""
    from blocklin.storage import versions

    held = blocklin.open(path)
    real, found = versions.coverage, []

    def counting(loc, entries=None):
        found.append(loc.url)
        return real(loc, entries)

    monkeypatch.setattr(versions, "coverage", counting)
    assert blocklin.norm(held) == pytest.approx(scipy.sparse.linalg.norm(_matrix()), rel=N * EPS)
    assert found.count(str(path)) == 1, found
