"""The single-pass sketch's pass at small budgets: short strips, generated test matrices, gathered writes.

References are computed in memory with NumPy from the same generated test matrices, so the comparisons
are of rounding only (tolerances: float64 sums of a few hundred terms of O(1) products, 1e-12 relative).
"""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import BudgetError
from blocklin.linalg.blocks import tall_kernels as K
from blocklin.linalg.blocks import random as rnd
from blocklin.linalg.lowrank import budget, sources
from blocklin.plan import passes as P
from blocklin.plan.svd import plan_svd, sketch_state_bytes, sketch_tasks
from blocklin.runtime.job import Job
from blocklin.runtime.passes import plan_kernel_pass, reduce_sum, run_pass
from blocklin.storage import create_array
from support.memcheck import needs_hwm, run_child
from support.tolerances import assert_gram, assert_product, assert_singular_values, product_bound


def _spectrum_matrix(m: int, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((m, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return (u * 0.8 ** np.arange(n)) @ v.T


def test_gaussian_rows_do_not_depend_on_the_strips():
    whole = rnd.GaussianRows(3, rnd.STREAM_UPSILON, 7).rows(0, 500)
    gen = rnd.GaussianRows(3, rnd.STREAM_UPSILON, 7)
    pieces = [gen.rows(r0, min(500, r0 + 13)) for r0 in range(0, 500, 13)]
    np.testing.assert_array_equal(np.vstack(pieces), whole)
    # another stream, seed or width: other numbers
    assert not np.array_equal(rnd.GaussianRows(3, rnd.STREAM_PHI, 7).rows(0, 500), whole)
    assert not np.array_equal(rnd.GaussianRows(4, rnd.STREAM_UPSILON, 7).rows(0, 500), whole)
    op = rnd.sketch_test_matrices(3, 300, 5, 11)
    np.testing.assert_array_equal(op[:, :5], rnd.GaussianRows(3, rnd.STREAM_SKETCH_OMEGA, 5).rows(0, 300))
    np.testing.assert_array_equal(op[:, 5:], rnd.GaussianRows(3, rnd.STREAM_SKETCH_PSI, 11).rows(0, 300))


def test_sketch_pass_with_short_strips_and_several_tasks(tmp_path, monkeypatch):
    """Strips of 7 rows in 3 tasks, Y gathered into chunks of several strips: every sketch as NumPy
    makes it from the same test matrices, and Y written whole."""
    m, n, kp, s, seed = 1000, 24, 6, 13, 5
    a = _spectrum_matrix(m, n)
    A = bl.from_array(a, tmp_path / "a.zarr", chunks=(128, n))
    with Job("svd", memory="4MiB", temp_dir=str(tmp_path)) as job:
        plan = plan_svd(m, n, 3, a.dtype, method="sketch", oversample=3, power_iters=None, memory=4 << 20,
                        max_passes=60)
        assert plan.sketch_size == (kp, s)
        src = sources.Streamed(job, job.operand(A, "a"), plan)
        params = src._sketch_params(seed)
        pp = plan_kernel_pass(job, K.sketch_kernel, [src.source], params, max_strip=7, min_tasks=3)
        assert pp.strip == 7 and len(pp.groups) == 3
        params["y_chunk"] = P.output_chunk_rows(pp, 40)
        assert params["y_chunk"] > pp.strip and params["y_chunk"] % pp.strip == 0
        per_group = (pp.groups[0][1] - pp.groups[0][0]) // pp.strip
        assert per_group % (params["y_chunk"] // pp.strip) == 0  # no chunk shared by two tasks
        y_path = tmp_path / "y.zarr"
        create_array(y_path, shape=(m, kp), dtype=a.dtype, chunks=(params["y_chunk"], kp), codec="none")
        states = run_pass(job, K.sketch_kernel, [src.source], params, plan=pp, outputs=(("Y", y_path),)).states
    op = rnd.sketch_test_matrices(seed, n, kp, s)
    ups = rnd.row_test_rows(seed, rnd.STREAM_UPSILON, kp).rows(0, m)
    phi = rnd.row_test_rows(seed, rnd.STREAM_PHI, s).rows(0, m)
    yt = a @ op
    y = yt[:, :kp]
    assert_product(bl.open(y_path).to_numpy(), y, a, op[:, :kp])
    assert_product(reduce_sum(states, "Xt"), a.T @ ups, a.T, ups)
    # products of the kernel's own A @ Omega: its error (the product bound) carried through by ||Phi||, ||Y||
    dyt = product_bound(a, op, a.dtype)
    assert_product(reduce_sum(states, "PZ"), phi.T @ yt, phi.T, yt, extra=np.linalg.norm(phi) * dyt)
    assert_gram(reduce_sum(states, "G"), y.T @ y, y, extra=2 * np.linalg.norm(y) * dyt)


def test_sketch_same_numbers_at_every_budget():
    """Streamed at budgets whose strips differ (and gather Y into chunks) and in memory: the same test
    matrices, so the same factorization up to rounding."""
    a = _spectrum_matrix(4000, 60, seed=2)
    ref = bl.svd(a, 5, method="sketch", seed=9)
    assert ref.report["in_core"]
    for memory in ("200KiB", "640KiB"):
        res = bl.svd(a, 5, method="sketch", seed=9, memory=memory)
        assert not res.report["in_core"]
        assert_singular_values(res.s, ref.s, n=a.shape[0])  # same numbers, strips summed in another order
        np.testing.assert_allclose(np.abs(res.U.to_numpy()), np.abs(np.asarray(ref.U.to_numpy())), atol=1e-10)
    # the sketch's accuracy against NumPy's SVD: with range and core sketches of l = 15 and s = 31
    # columns, Tropp, Yurtsever, Udell and Cevher (2019), Theorem 5.1, bound the approximation Ahat's
    # mean squared error E||A - Ahat||_F^2 <= (1 + f(l, s)) min_{r < l - 1} (1 + f(r, l)) tau_{r+1}^2,
    # f(a, b) = a / (b - a - 1), tau_{r+1}^2 the squared tail beyond r (Gaussian test matrices; the signs
    # of Upsilon and Phi measured alike: docs/benchmarks.md, "Sign test matrices for the rows of A"), and
    # each singular value moves by at most ||A - Ahat||_2 <= ||A - Ahat||_F (Weyl). Over 100 seeds the
    # largest error was 0.09 against this root-mean-square bound of 0.43; a relative 5% on the fifth value
    # (0.4096, beside a tail of 0.8^15 = 3.5e-2) failed for 29% of seeds with normals, 30% with signs.
    assert ref.report["sketch_size"] == [15, 31]
    s = np.linalg.svd(a, compute_uv=False)
    l, sk = 15, 31
    tail2 = np.cumsum((s ** 2)[::-1])[::-1]  # tail2[r] = sum_{j >= r} s_j^2 (0-based: the tail beyond r values)
    f = lambda x, y: x / (y - x - 1)  # noqa: E731
    rms = np.sqrt((1 + f(l, sk)) * min((1 + f(r, l)) * tail2[r] for r in range(l - 1)))
    assert np.abs(ref.s - s[:5]).max() <= rms


def test_sketch_tasks_bound_their_states():
    # 1 GiB of rows: 32 tasks by the canonical split, fewer where their N x kp states would crowd the budget
    M, N, sk = 1 << 17, 1024, (40, 81)
    assert sketch_tasks(M, N, sk, 8, 1 << 40) == P.canonical_tasks(M, N * 8) == 32
    small = sketch_tasks(M, N, sk, 8, 16 << 20)
    assert small * sketch_state_bytes(N, sk) <= (16 << 20) // 8 < (small + 1) * sketch_state_bytes(N, sk)
    assert sketch_tasks(M, N, sk, 8, 1 << 20) == 1


def test_sketch_refusal_states_a_smaller_minimum(tmp_path):
    """Omega and Psi are generated in the pass's tasks, not held beside it: on a 4096 x 4096 float64
    operand with k = 10 the stated minimum is under 4 MiB (8 MiB when the client held them and their
    copies), and a budget of that minimum plans every pass."""
    path = tmp_path / "a.zarr"
    create_array(path, shape=(4096, 4096), dtype="f8", chunks=(1024, 1024), codec="none")  # no chunk written
    with pytest.raises(BudgetError, match="memory: must hold") as info:
        bl.svd(path, 10, method="sketch", seed=0, memory="2MiB")
    need = info.value.minimum
    assert 2 << 20 < need < 4 << 20
    with Job("svd", memory=need) as job:
        A = job.operand(path, "a")
        plan = budget.fitting_plan(job, A, 10, dict(method="sketch", oversample=10, power_iters=None, max_passes=60,
                                               block_size=None, max_basis=None))
        assert not plan.in_core and plan.memory == need


PEAK_CHILD = """
    import numpy as np, scipy.linalg
    import blocklin as bl
    import dask.threaded  # noqa: F401
    path, warm, memory = sys.argv[1], sys.argv[2], int(sys.argv[3])
    bl.open(path)[0:1, 0:1]
    bl.svd(warm, 2, method="sketch", memory=memory, seed=0)  # lazy imports and thread pools join the baseline
    warm_blas()  # and the BLAS work buffers of the pass's two tasks
    reset_hwm()
    base = hwm()  # the resident memory now (the warm-up's own peak is not a baseline)
    res = bl.svd(path, 10, method="sketch", memory=memory, seed=0)
    print(json.dumps({"used": hwm() - base, "in_core": res.report["in_core"], "s0": float(res.s[0])}))
"""


@needs_hwm
def test_sketch_peak_at_a_sixteenth_of_wide_rows(tmp_path):
    """At 1/16 of a 4096 x 1024 operand (rows of 8 KiB, a fixed state of N (2 kp + s) elements), the
    process's high-water mark stays within the budget + 10% (measured like benchmarks/budgets.py: after a
    warm-up run, so imports and thread pools are in the baseline)."""
    a = bl.random(tmp_path / "a.zarr", (4096, 1024), seed=1, chunks=(1024, 1024))
    warm = bl.random(tmp_path / "w.zarr", (64, 64), seed=2, chunks=(32, 32))
    budget = a.nbytes // 16  # 2 MiB
    r = run_child(PEAK_CHILD, a.path, warm.path, str(budget))
    assert not r["in_core"] and np.isfinite(r["s0"])
    assert r["used"] <= 1.1 * budget, f"used {r['used'] / 2**20:.2f} MiB over a {budget / 2**20:.0f} MiB budget"
