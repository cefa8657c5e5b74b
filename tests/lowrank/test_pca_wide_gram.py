"""The centered (and scaled) Gram route of a wide matrix: ``svd(method="gram", center=True)`` and
``pca(method="gram")`` of ``m < n`` data, scikit-learn's ``covariance_eigh`` of a wide ``X``.

The ``m x m`` Gram ``A_c A_c^H`` comes from column strips of ``A`` centered by their own means as they
are read (:func:`blocklin.linalg.blocks.center.moments_and_row_gram`); its top eigenvectors are the
subspace of the Rayleigh-Ritz pass, which gives ``s`` and ``V = A_c^H U S^-1``. Checked against
``numpy.linalg.svd`` of the centered matrix and scikit-learn's ``PCA(svd_solver="covariance_eigh")``, in
memory and at the least budget, float32, float64 and complex128, on every scheduler.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.decomposition import PCA

import blocklin as bl
from blocklin.linalg.blocks.center import moments_and_row_gram
from blocklin.runtime.job import Job
from support.conformance import dense, least_budget, run
from support.tolerances import (assert_explained_variance, assert_mean, assert_orthonormal, assert_singular_values,
                                eps)

K = 4


def make(m: int, n: int, dtype, seed: int = 0, rank: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A wide ``m x n`` matrix ``A = X_c + 1 mu^T`` with well separated leading singular values of the
    centered ``X_c`` (and means five times its spread), and ``A_c`` in float64 (complex128)."""
    rng = np.random.default_rng(seed)
    cplx = np.dtype(dtype).kind == "c"
    r = min(m, n) if rank is None else rank

    def gauss(*shape):
        g = rng.standard_normal(shape)
        return g + 1j * rng.standard_normal(shape) if cplx else g

    u, _ = np.linalg.qr(gauss(m, r))
    v, _ = np.linalg.qr(gauss(n, r))
    s = np.concatenate([[8.0, 6.0, 4.5, 3.4, 2.6], 1.6 / np.sqrt(1.0 + np.arange(max(0, r - 5)))])[:r]
    x = (u * s) @ v.conj().T
    x -= x.mean(axis=0)
    a = (x + 5.0 * np.linalg.norm(x, 2) / np.sqrt(m) * (1 + rng.random(n))).astype(dtype)
    wide = np.complex128 if cplx else np.float64
    a64 = a.astype(wide)
    return a, a64 - a64.mean(axis=0)


def _check_svd(res, a, ac, dtype, *, scaled: bool = False) -> None:
    """``s`` by Weyl at the rounding of the uncentered data (the streamed products are formed before the
    means are removed), ``U`` and ``V`` orthonormal, and each triplet's vectors within Wedin's bound
    ``(||A_c v - s u|| + ||A_c^H u - s v||) / gap`` of NumPy's (plus the products' rounding)."""
    U, s, Vt = dense(res.U), np.asarray(res.s), dense(res.Vt)
    m, n = a.shape
    wide = np.complex128 if np.dtype(dtype).kind == "c" else np.float64
    data = a.astype(wide) / (res.scale if scaled else 1.0)
    norm = np.linalg.norm(data, 2)
    u0, s0, vt0 = np.linalg.svd(ac, full_matrices=False)
    assert res.report["method"] == "gram"
    assert_singular_values(s, s0[:K], n=n, dtype=dtype, s1=norm)
    assert_orthonormal(U, n=m, dtype=dtype)
    assert_orthonormal(Vt.conj().T, n=n, dtype=dtype)
    u, v = U.astype(wide), Vt.conj().T.astype(wide)
    r = np.linalg.norm(ac @ v - u * s, axis=0) + np.linalg.norm(ac.conj().T @ u - v * s, axis=0)
    gaps = np.array([np.min(np.abs(np.delete(s0, i) - s0[i])) for i in range(K)])
    rounding = 4 * n * eps(dtype) * norm
    v0 = vt0[:K].conj().T
    sin = np.linalg.norm(v - v0 * np.sum(v0.conj() * v, axis=0), axis=0)  # not sqrt(1 - cos^2): sqrt(eps) off
    assert np.all(sin <= (r + rounding) / gaps), (sin, (r + rounding) / gaps)


@pytest.mark.parametrize("memory", [None, "least"], ids=["in-memory", "streamed"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128])
def test_centered_wide_gram_matches_numpy(dtype, memory, tmp_path):
    a, ac = make(40, 700, dtype, seed=1)
    res = run(lambda mem: bl.svd(a, K, method="gram", center=True, seed=0, memory=mem, temp_dir=str(tmp_path)),
              memory)
    assert res.report["in_core"] == (memory is None)
    if memory == "least":  # the Gram with the means, one Rayleigh-Ritz pass (no Lanczos step on this spectrum)
        assert res.report["passes"] == 2 and res.report["lanczos_steps"] == 0
        assert "the column means from the first pass" in res.report["passes_formula"]
    assert_mean(res.mean, a)
    _check_svd(res, a, ac, dtype)


@pytest.mark.parametrize("memory", [None, "least"], ids=["in-memory", "streamed"])
@pytest.mark.parametrize("center", [True, False], ids=["standardized", "scaled-only"])
def test_scaled_wide_gram_matches_numpy(center, memory, tmp_path):
    """``scale=True``: the rows of ``B = A^T`` divided by their standard deviations as they are read."""
    a, ac = make(40, 700, np.float64, seed=2)
    a[:, 7] = 3.0  # a constant column keeps its scale 1
    ac[:, 7] = 0.0
    sd = np.where(ac.std(axis=0) > 0, ac.std(axis=0), 1.0)
    res = run(lambda mem: bl.svd(a, K, method="gram", center=center, scale=True, seed=0, memory=mem,
                                 temp_dir=str(tmp_path)), memory)
    np.testing.assert_allclose(res.scale, sd, rtol=100 * 40 * eps(np.float64))
    _check_svd(res, a, (ac if center else a) / sd, np.float64, scaled=True)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("memory", [None, "least"], ids=["in-memory", "streamed"])
def test_pca_matches_sklearn_covariance_eigh(dtype, memory, tmp_path):
    """``pca(method="gram")`` of wide data against ``PCA(svd_solver="covariance_eigh")``: the same
    components (scikit-learn's signs), variances, mean and noise."""
    a, ac = make(30, 500, dtype, seed=3)
    ours = run(lambda mem: bl.pca(a, K, method="gram", seed=0, memory=mem, temp_dir=str(tmp_path)), memory)
    ref = PCA(K, svd_solver="covariance_eigh").fit(a.astype(np.float64))
    assert ours.report["method"] == "gram" and ours.components_.dtype == dtype
    assert_mean(ours.mean_, a)
    assert_explained_variance(ours.explained_variance_, ref.explained_variance_, ours.explained_variance_ratio_,
                              ref.explained_variance_ratio_, a, dtype=dtype)
    s0 = np.linalg.svd(ac, compute_uv=False)
    gaps = np.array([np.min(np.abs(np.delete(s0, i) - s0[i])) for i in range(K)])
    # the same rule's signs; the angle to the reference's within the residual over the gap (Wedin),
    # scikit-learn's own eigh of the covariance carrying its rounding, n eps ||A||^2 / s_i, too
    norm = np.linalg.norm(a.astype(np.float64), 2)
    bound = (ours.report["tol"] * s0[:K] + 4 * 500 * eps(dtype) * norm * (1 + norm / s0[:K])) / gaps
    err = np.linalg.norm(ours.components_.astype(np.float64) - ref.components_, axis=1)
    assert np.all(err <= 2 * bound), (err, bound)
    total = np.sum(ac.var(axis=0, ddof=1))
    noise = (total - ref.explained_variance_.sum()) / (min(a.shape) - K)
    assert abs(ours.noise_variance_ - noise) <= 4 * 30 * eps(dtype) * norm ** 2 / 29 * (1 + K)


@pytest.mark.parametrize("scheduler", ["threads", "processes"])
def test_identical_bits_on_every_scheduler(scheduler, tmp_path):
    """The Gram's task sums are added in row order and the task split is fixed: the same bits."""
    a, _ = make(30, 600, np.float64, seed=4)
    runs = [least_budget(lambda mem, s=s: bl.svd(a, K, method="gram", center=True, scale=True, seed=5, memory=mem,
                                                  scheduler=s, workers=2, temp_dir=str(tmp_path)))
            for s in ("sync", scheduler)]
    assert not runs[0].report["in_core"]
    for name in ("mean", "scale", "s", "U"):
        np.testing.assert_array_equal(getattr(runs[0], name), getattr(runs[1], name))
    np.testing.assert_array_equal(dense(runs[0].Vt), dense(runs[1].Vt))


def test_rank_deficient_gives_zeros_and_an_orthonormal_completion(tmp_path):
    """Centered rank 2 < k: the Gram's eigenvalues below its rounding are zero singular values, their
    vectors an orthonormal completion (as every route's)."""
    a, ac = make(30, 500, np.float64, seed=6, rank=2)
    res = least_budget(lambda mem: bl.svd(a, K, method="gram", center=True, seed=0, memory=mem,
                                          temp_dir=str(tmp_path)))
    s0 = np.linalg.svd(ac, compute_uv=False)
    assert_singular_values(res.s[:2], s0[:2], n=500, s1=np.linalg.norm(a, 2))
    assert np.all(res.s[2:] == 0)
    assert_orthonormal(res.U, n=30)
    assert_orthonormal(dense(res.Vt).T, n=500)


@pytest.mark.parametrize("block_bytes", [None, 25 * 8 * 100], ids=["one block a strip", "blocks of 100 rows"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_row_gram_is_the_centered_gram_whatever_the_means(dtype, block_bytes, monkeypatch):
    """Each column is centered by its own mean before its square is added: no cancellation with means
    10^6 times the spread (``A A^T - ...`` would lose every digit in float64); a strip's blocks alike."""
    from blocklin.linalg.blocks import center

    if block_bytes is not None:
        monkeypatch.setattr(center, "MOMENTS_BLOCK_BYTES", block_bytes)
    rng = np.random.default_rng(7)
    a = (rng.standard_normal((25, 3000)) * np.linspace(1, 3, 3000) + 1e6 * (1 + rng.random(3000))).astype(dtype)
    with Job("test", memory="256KiB") as job:
        A = job.operand(a, "a")
        moments, g = moments_and_row_gram(job, A, center=True, standardize=False, memory=256 << 10)
        assert job.passes("a") == 1
    x = a.astype(np.float64)
    c = x - x.mean(axis=0)
    ref = c @ c.T
    assert_mean(moments.mean, x)
    # each deviation carries its mean's rounding, eps(float64) |mu| (10^6 spreads here) and the sum of
    # the squares n eps: relative to |mu| / spread times ||A_c||_F^2
    bound = 4 * 3000 * np.finfo(np.float64).eps * np.abs(x.mean(axis=0)).max() / c.std(axis=0).min() \
        * np.linalg.norm(c) ** 2
    assert np.linalg.norm(g - ref) <= bound
    np.testing.assert_allclose(moments.var, c.var(axis=0), rtol=bound / np.linalg.norm(c) ** 2)
    assert np.array_equal(g, g.T)


def test_wide_means_pass_splits_into_two_tasks_where_their_sums_are_small():
    """The means pass of a wide ``A`` runs as two one-core tasks, each with its own ``m x m`` float64 sum,
    where the two sums take at most an eighth of the budget and two tasks' plan fits, else as one task;
    the values within the centered Gram's bound either way, and the split decided by the shape and the
    budget alone: the same bits on every scheduler."""
    from blocklin.errors import BudgetError
    from blocklin.linalg.blocks.center import plan_moments_row_gram
    from blocklin.linalg.lowrank.sources import GRAM_PASS, moments_gram_split
    from blocklin.plan.gram import GRAM_SPLIT_SHARE, gram_tasks

    row_gram = {"center": True, "standardize": False}
    two_tasks = {"min_tasks": 2, "workers": 2}

    def least(job, A, split):
        try:
            plan_moments_row_gram(job, A, memory=1024, **row_gram, **split)
        except BudgetError as err:
            return int(err.minimum)
        raise AssertionError("1 KiB fits")

    # sums small beside the budget, but two tasks' strips do not fit where one task's just do
    narrow, _ = make(5, 3000, np.float64, seed=6)
    with Job("test", memory="1MiB") as job:
        A = job.operand(narrow, "a")
        one, two = least(job, A, GRAM_PASS), least(job, A, two_tasks)
        assert one < two and gram_tasks(5, np.float64, one, gpu=False) == 2
        assert moments_gram_split(job, A, one, 0, row_gram=row_gram) == GRAM_PASS
        assert moments_gram_split(job, A, two, 0, row_gram=row_gram) == two_tasks

    m, n = 120, 3000
    a, ac = make(m, n, np.float64, seed=6)
    sums = 2 * m * m * 8  # the two float64 sums
    roomy, tight = int(sums / GRAM_SPLIT_SHARE) + 4096, int(sums / GRAM_SPLIT_SHARE) - 4096
    ref = ac @ ac.T
    # each deviation carries its mean's rounding, eps(float64) |mu|, and each sum n products' rounding:
    # relative to |mu| / spread times ||A_c||_F^2 (as test_row_gram_is_the_centered_gram_whatever_the_means)
    x = a.astype(np.float64)
    bound = 4 * n * np.finfo(np.float64).eps * np.abs(x.mean(axis=0)).max() / ac.std(axis=0).min() \
        * np.linalg.norm(ac) ** 2
    for memory, tasks in ((roomy, 2), (tight, 1)):
        got = []
        for scheduler in ("sync", "threads", "processes"):
            with Job("test", memory=memory, scheduler=scheduler) as job:
                A = job.operand(a, "a")
                split = moments_gram_split(job, A, memory, 0, row_gram=row_gram)
                assert split == (two_tasks if tasks == 2 else GRAM_PASS)
                moments, g = moments_and_row_gram(job, A, memory=memory, **row_gram, **split)
                assert job.stats["tasks"] == tasks
            got.append(g)
            assert_mean(moments.mean, a)
        assert all(np.array_equal(got[0], g) for g in got[1:])
        assert np.linalg.norm(got[0] - ref) <= bound


def test_centered_svd_and_pca_take_the_split(monkeypatch, tmp_path):
    """``svd(center=True)`` and ``pca`` of a wide ``A`` out of core run its means pass as the split says."""
    from blocklin.linalg.lowrank import centering

    seen = []
    real = centering.moments_and_row_gram

    def spy(*args, **kwargs):
        seen.append((kwargs.get("min_tasks"), kwargs.get("workers")))
        return real(*args, **kwargs)

    monkeypatch.setattr(centering, "moments_and_row_gram", spy)
    a, ac = make(40, 20000, np.float64, seed=7)  # 6.4 MB: streamed at 4 MiB, its two 40 x 40 sums small
    res = bl.svd(a, K, method="gram", center=True, seed=0, memory="4MiB", temp_dir=str(tmp_path))
    assert not res.report["in_core"] and seen == [(2, 2)]
    _check_svd(res, a, ac, np.float64)
    bl.pca(a, K, method="gram", seed=0, memory="4MiB", temp_dir=str(tmp_path))
    assert seen == [(2, 2)] * 2


def test_least_budget_refusal_names_the_whole_call(tmp_path):
    """A budget too small for the Gram pass is refused naming a minimum at which the whole call runs."""
    a, _ = make(40, 700, np.complex128, seed=8)
    with pytest.raises(bl.errors.BudgetError, match=r"memory.*svd \(gram\)") as info:
        bl.svd(a, K, method="gram", center=True, seed=0, memory="64KiB", temp_dir=str(tmp_path))
    res = bl.svd(a, K, method="gram", center=True, seed=0, memory=info.value.minimum, temp_dir=str(tmp_path))
    assert res.report["method"] == "gram" and not res.report["in_core"]
