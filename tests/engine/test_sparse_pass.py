"""Products of a stored sparse matrix run as tasks on the job's scheduler
(:mod:`blocklin.runtime.sparse_pass`): the same bits on every scheduler and in the caller, against
SciPy's product within the rounding of its dot products, and the budget refused with its minimum."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import blocklin as bl
import blocklin.runtime.sparse_pass as sparse_pass
from blocklin.errors import BudgetError
from blocklin.runtime.job import Job, current_job
from support.tolerances import eps


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A 30000 x 300 sparse matrix stored at the conversion's smallest budget: several row blocks."""
    x = sp.random(30000, 300, density=0.03, random_state=4, format="csr")
    return x, bl.from_sparse(x, tmp_path_factory.mktemp("sparse") / "S.zarr", memory="9MiB")


@pytest.fixture
def stored(written, monkeypatch):
    """The matrix with its row blocks cut into several groups (tasks)."""
    monkeypatch.setattr(sparse_pass, "GROUP_ENTRIES", 50000)
    x, s = written
    assert s.n_blocks >= 5 and len(sparse_pass.row_groups(s._store)) >= 3
    return x, s


def _products(s, x, y, **settings):
    op = s.aslinearoperator()
    if not settings:
        return op.matmat(x), op.rmatmat(y), None
    with Job("test", **settings) as job:
        assert current_job() is job
        sx, sty = op.matmat(x), op.rmatmat(y)
        return sx, sty, job.stats["tasks"]


def test_products_have_the_same_bits_on_every_scheduler(stored, rng):
    xs, s = stored
    x, y = rng.standard_normal((300, 5)), rng.standard_normal((30000, 5))
    ref_sx, ref_sty, _ = _products(s, x, y)  # in the caller, no job
    groups = len(sparse_pass.row_groups(s._store))
    for scheduler in ("sync", "threads", "processes"):
        sx, sty, tasks = _products(s, x, y, scheduler=scheduler, workers=2)
        assert tasks == 2 * groups, scheduler  # every group a task, for each product
        assert np.array_equal(sx, ref_sx) and np.array_equal(sty, ref_sty), scheduler
    # SciPy's product: each entry a dot product of at most the row's (column's) entries, so within
    # gamma_nnz |S| |x| (Higham, Accuracy and Stability, 3.5); nnz per row is below 40 here, per column below 1100
    bound = 40 * eps(np.float64) * (abs(xs) @ abs(x))
    assert (abs(ref_sx - xs @ x) <= bound).all()
    assert (abs(ref_sty - xs.T @ y) <= 1100 * eps(np.float64) * (abs(xs).T @ abs(y))).all()
    assert current_job() is None


def test_returned_partials_are_added_a_batch_at_a_time(stored, rng, monkeypatch):
    """Under ``processes`` the tasks return their partials of ``S^T Y``: the groups run a batch of the
    workers at a time and each batch is added as it returns (never every group's ``n x k`` partial held
    at once), with the bits of the caller's product and one pass counted."""
    xs, s = stored
    y = rng.standard_normal((30000, 5))
    ref = s.aslinearoperator().rmatmat(y)
    graphs = []
    real = Job.run

    def run(self, graph, **kw):
        graphs.append((len(graph.tasks), kw.get("count_pass")))
        return real(self, graph, **kw)

    monkeypatch.setattr(Job, "run", run)
    with Job("test", scheduler="processes", workers=2) as job:
        got = s.aslinearoperator().rmatmat(y)
        passes = job.passes("a")
    groups = len(sparse_pass.row_groups(s._store))
    assert np.array_equal(got, ref)
    assert len(graphs) == -(-groups // 2) and passes == 1 and max(t for t, _ in graphs) == 2
    assert [c for _, c in graphs] == ["a"] + [None] * (len(graphs) - 1)


def test_svd_passes_run_as_tasks_and_match_the_caller(stored):
    xs, s = stored
    res = bl.svd(s, 3, seed=0, scheduler="threads", workers=2)
    again = bl.svd(s, 3, seed=0, scheduler="sync")
    assert res.report["tasks"] >= 2 * res.report["operator_products"]
    assert np.array_equal(res[1], again[1])
    full = np.linalg.svd(xs.toarray(), compute_uv=False)
    assert np.allclose(res[1], full[:3], rtol=0, atol=float(np.max(res.report["residuals"])) * 10 + 1e-12)


def test_a_budget_below_one_task_is_refused_with_the_minimum(stored, rng):
    _, s = stored
    with Job("test", memory="16KiB") as job:
        with pytest.raises(BudgetError, match=r"memory: a product S X holds X, the result and one task's row block.*"
                                              r"raise the budget \(memory='") as info:
            s.aslinearoperator().matmat(rng.standard_normal((300, 2)))
        assert job.stats["tasks"] == 0
    assert info.value.minimum > 16 * 1024


@pytest.mark.slow
def test_products_on_a_cluster_have_the_same_bits(stored, rng, client):
    _, s = stored
    x, y = rng.standard_normal((300, 3)), rng.standard_normal((30000, 3))
    ref_sx, ref_sty, _ = _products(s, x, y)
    sx, sty, tasks = _products(s, x, y, scheduler=client)
    assert tasks > 0 and np.array_equal(sx, ref_sx) and np.array_equal(sty, ref_sty)


@pytest.mark.parametrize("scheduler", ["sync", "threads", "processes"])
def test_a_product_leaves_no_reference_cycle_holding_its_operands(stored, rng, scheduler):
    """A graph's arguments and results are freed when the caller drops them, not when the cyclic
    collector's oldest generation next runs: an iterative method makes a product a step, and each one
    left in a cycle (the run's progress callback was a class made per run) kept its X and result
    (measured 1.11x a budget that then fit in 0.59x)."""
    import gc

    _, s = stored
    x = rng.standard_normal((300, 5))
    with Job("test", scheduler=scheduler, workers=2) as job:
        s.aslinearoperator().matmat(x)
        gc.collect()  # whatever came before
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            s.aslinearoperator().matmat(x)
            s.aslinearoperator().rmatmat(rng.standard_normal((30000, 5)))
            gc.collect()
            left = [o for o in gc.garbage if isinstance(o, np.ndarray) or type(o).__name__ in ("TileGraph", "ProductSpec")]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        assert job.stats["tasks"] > 0
    assert left == [], [type(o).__name__ for o in left]


def _least_peak(fn, reset, runs: int = 3) -> int:
    """The least of ``runs`` tracemalloc peaks of ``fn()`` (``reset()`` before each, outside the count).
    tracemalloc counts every thread's allocations, and a test cluster's event loop (this module's
    ``client``) allocates now and then beside the call; a temporary of the call is in every run."""
    import tracemalloc

    peaks = []
    for _ in range(runs):
        reset()
        tracemalloc.start()
        fn()
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    reset()
    return min(peaks)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("index", [np.int32, np.int64])
def test_transposed_products_add_into_the_result_without_a_temporary(dtype, index):
    """``out += blk^T y`` of a row block in place: equal to SciPy's ``blk.T @ y`` added (each entry a sum
    of at most ``nnz`` of its column's terms more: bounded by ``(c + 1) eps (|out| + |blk|^T |y|)``, c the
    column count of the block), and no ``n x k`` temporary allocated (tracemalloc's peak below one)."""
    rng = np.random.default_rng(3)
    blk = sp.random(400, 20000, density=0.002, random_state=4, format="csr").astype(dtype)
    blk.indptr, blk.indices = blk.indptr.astype(index), blk.indices.astype(index)
    y = rng.standard_normal((400, 6)).astype(dtype)
    out = rng.standard_normal((20000, 6)).astype(dtype)
    ref = out + blk.T @ y
    got = out.copy()
    peak = _least_peak(lambda: sparse_pass._add_transposed_product(got, blk, y),
                       lambda: np.copyto(got, out))
    sparse_pass._add_transposed_product(got, blk, y)
    assert peak < got.nbytes / 4, peak
    col = np.diff(blk.tocsc().indptr).max()
    bound = (col + 1) * eps(dtype) * 4 * (np.abs(out) + abs(blk).T @ np.abs(y))
    assert np.all(np.abs(got - ref) <= bound)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("k", [9, 24])
def test_wide_products_in_column_slabs_have_the_bits_of_one_call(monkeypatch, transposed, k):
    """A product wider than ``SLAB_COLUMNS`` runs a slab of columns per kernel call: every column's sums in
    the same order, so the bits of one call over all columns; the slabs' copies stay within the block
    product temporary the plan counts (tracemalloc's peak), and a block too narrow for them is not cut."""
    rng = np.random.default_rng(8)
    blk = sp.random(3000, 2500, density=0.004, random_state=5, format="csr")
    x = rng.standard_normal((3000 if transposed else 2500, k))
    out0 = rng.standard_normal((2500, k)) if transposed else np.zeros((3000, k))

    def run(slab):
        monkeypatch.setattr(sparse_pass, "SLAB_COLUMNS", slab)
        got = out0.copy()

        def product():
            if transposed:
                sparse_pass._add_transposed_product(got, blk, x)
            else:
                sparse_pass._put_product(got, blk, x)

        peak = _least_peak(product, lambda: np.copyto(got, out0))
        product()
        return got, peak

    whole, _ = run(10**6)
    sliced, peak = run(8)
    # 24 columns: cut (the copies' 5500 x 8 fit the block's counted rows x 24); 9 columns: no room, one call
    assert sparse_pass.slab_width(k, 5500, (2500 if transposed else 3000) * k) == (8 if k == 24 else k)
    assert np.array_equal(sliced, whole)
    assert peak <= (2500 if transposed else 3000) * k * 8  # within the counted n x k (rows x k) temporary
    # a plan with no room for the copies: one call
    assert sparse_pass.slab_width(k, 5500, 5500 * 8 - 1) == k


@pytest.mark.parametrize("threads", [False, True])
@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_the_normal_sweep_has_the_bits_of_the_two_products(monkeypatch, threads, dtype):
    """``S X`` and ``S^T (S X)`` in one sweep over a block, in pieces (the rows shared by two threads, the
    terms in row order on one): the bits of the two products; a failure in the helper thread is raised,
    not waited for."""
    from blocklin.runtime.pools import compute_pool

    monkeypatch.setattr(sparse_pass, "SWEEP_ENTRIES", 1500)
    rng = np.random.default_rng(9)
    blk = sp.random(4000, 3000, density=0.003, random_state=6, format="csr").astype(dtype)
    x = rng.standard_normal((3000, 4)).astype(dtype)
    y_ref, z_ref = np.zeros((4000, 4), dtype), rng.standard_normal((3000, 4)).astype(dtype)
    z = z_ref.copy()
    sparse_pass._put_product(y_ref, blk, x)
    sparse_pass._add_transposed_product(z_ref, blk, y_ref)
    y = np.zeros_like(y_ref)
    sparse_pass.normal_sweep(blk, x, y, z, compute_pool(1) if threads else None)
    assert np.array_equal(y, y_ref) and np.array_equal(z, z_ref)
    if threads:
        calls = []
        real = sparse_pass._csr_matvecs

        def failing(*args):
            calls.append(1)
            if len(calls) == 3:
                raise MemoryError("no room")
            return real(*args)

        monkeypatch.setattr(sparse_pass, "_csr_matvecs", failing)
        with pytest.raises(MemoryError, match="no room"):
            sparse_pass.normal_sweep(blk, x, np.zeros_like(y_ref), z.copy(), compute_pool(1))


@pytest.mark.parametrize("hold", [False, True])
@pytest.mark.parametrize("scheduler, most", [("sync", 1), ("threads", 2)])
def test_transposed_partials_are_added_as_they_finish_not_all_held(stored, rng, monkeypatch, hold, scheduler, most):
    """``S^T Y``: every group's ``n x k`` partial was held until the last finished (5 here), where the plans
    count one per running task; now each is added in group order as it finishes (the same bits: the
    first test) and no more partials are alive than tasks run."""
    import weakref

    _, s = stored
    groups = len(sparse_pass.row_groups(s._store))
    live, peak = [0], [0]
    product = sparse_pass.group_product

    def counted(*args, **kwargs):
        out = product(*args, **kwargs)
        if args[4]:  # transposed: a partial
            live[0] += 1
            peak[0] = max(peak[0], live[0])
            weakref.finalize(out, lambda: live.__setitem__(0, live[0] - 1))
        return out

    monkeypatch.setattr(sparse_pass, "group_product", counted)
    monkeypatch.setattr(sparse_pass, "HOLD_BLOCKS", hold)
    y = rng.standard_normal((30000, 5))
    with Job("test", scheduler=scheduler, workers=2) as job:
        if hold:
            assert sparse_pass.hold_blocks(job, s._store, np.float64, 0, 0)
        sty = s.aslinearoperator().rmatmat(y)
    assert groups >= 5 and 1 <= peak[0] <= most
    assert np.array_equal(sty, s.aslinearoperator().rmatmat(y))  # in the caller, no job


def test_a_failed_group_fails_the_product_without_leaving_tasks_waiting_for_their_turn(stored, rng, monkeypatch):
    """The first group fails while later ones have finished and wait for their turn to add: the product
    raises that group's error and ends (no thread left waiting)."""
    import sys
    import time

    _, s = stored
    product = sparse_pass.group_product

    def first_fails(store, b0, b1, *args, **kwargs):
        if b0 == 0 and args[1]:
            time.sleep(0.3)  # the other groups finish first and wait
            raise OSError("a row block could not be read")
        return product(store, b0, b1, *args, **kwargs)

    monkeypatch.setattr(sparse_pass, "group_product", first_fails)
    monkeypatch.setattr(sparse_pass, "HOLD_BLOCKS", False)
    with pytest.raises(OSError, match="could not be read"):  # returns: the run's pool joined its threads
        with Job("test", scheduler="threads", workers=2):
            s.aslinearoperator().rmatmat(rng.standard_normal((30000, 5)))
    waiting = [f for f in sys._current_frames().values() if f.f_code.co_name == "add" and "sparse_pass" in f.f_code.co_filename]
    assert not waiting


def test_diagonal_positions_in_pieces_match_the_whole_test(rng):
    """Entries on the diagonal of CSR rows, found piece by piece (pieces of 1 to many rows, rows longer
    than a piece, rows without entries, duplicates, unsorted columns), are those of the direct test."""
    for trial in range(30):
        m, n = int(rng.integers(1, 60)), int(rng.integers(1, 60))
        dense = (rng.random((m, n)) < rng.random()) * rng.standard_normal((m, n))
        x = sp.csr_matrix(dense)
        x.indices, x.data = x.indices.copy(), x.data.copy()
        if x.nnz:  # a duplicate of every diagonal entry, and each row's columns reversed
            x = sp.csr_matrix((np.concatenate([x.data, np.ones(min(m, n))]), (np.concatenate(
                [np.repeat(np.arange(m), np.diff(x.indptr)), np.arange(min(m, n))]), np.concatenate(
                [x.indices, np.arange(min(m, n))]))), shape=(m, n))
            x.has_canonical_format = False
        for lo, hi in zip(x.indptr[:-1], x.indptr[1:]):
            x.indices[lo:hi], x.data[lo:hi] = x.indices[lo:hi][::-1].copy(), x.data[lo:hi][::-1].copy()
        row0 = int(rng.integers(0, 3))
        rows = np.repeat(np.arange(row0, row0 + m), np.diff(x.indptr))
        want = np.flatnonzero(x.indices == rows)
        for piece in (1, 2, 3, 7, 1 << 16):
            assert np.array_equal(sparse_pass.diagonal_positions(x.indptr, x.indices, row0, piece), want), (trial, piece)


def test_a_blocks_diagonal_is_zeroed_without_transients_of_its_size(tmp_path, monkeypatch):
    """A Laplacian's products read each row block with its diagonal as zeros: that test held each entry's
    row number and a flag, and a copy of the values, 17 bytes an entry beyond the block the plans count
    (12 MB for this block of 1.3M entries); now about a piece's worth (:data:`DIAGONAL_PIECE`)."""
    import tracemalloc

    n = 2000
    x = sp.random(n, n, density=1.0, random_state=1, format="csr", dtype=np.float64)
    s = bl.from_sparse(x, tmp_path / "S.zarr", memory="256MiB")
    r1 = int(s._store.row_blocks[1])  # the first row block: over a million entries
    assert r1 * n > 1 << 20
    read = s._store.read_rows(0, r1)  # read once, outside the traced calls
    monkeypatch.setattr(s._store, "read_rows", lambda r0, r1: read)
    # the peak from the read to SciPy's CSR (whose own copies come after the zeroing)
    peaks, csr = {}, sp.csr_matrix
    monkeypatch.setattr(sp, "csr_matrix", lambda *a, **k: (peaks.setdefault(
        "now", tracemalloc.get_traced_memory()[1]), csr(*a, **k))[1])
    for offdiagonal in (False, True):
        tracemalloc.start()
        blk = sparse_pass.read_block(s._store, 0, r1, np.float64, offdiagonal=offdiagonal)
        tracemalloc.stop()
        peaks[offdiagonal] = peaks.pop("now")
        if offdiagonal:
            want = x[:r1].toarray()
            want[np.arange(r1), np.arange(r1)] = 0
            assert np.array_equal(blk.toarray(), want)
        del blk
    # the zeroing's own transients: a piece's row numbers, flags and positions (17 bytes an entry) and the
    # diagonal's positions, well under 4 MiB
    assert peaks[True] - peaks[False] < 4 << 20, peaks
