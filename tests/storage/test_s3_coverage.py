"""Results of operands and outputs on ``s3://`` (moto's S3 server on loopback) against NumPy and SciPy,
for the public operations no other test checks there: ``cholesky``, ``lu``, ``qr``, ``lstsq``,
``solve_triangular``, ``cho_solve``, ``lu_solve``, ``pca``, ``norm``, ``cond``, ``det``, ``slogdet``,
``aslinearoperator``, ``append`` (then ``update``; sparse rows to a local sparse matrix) and NumPy's protocol functions on a ``Matrix`` opened
from S3 (its upcast copy among them).

Small chunks and budgets of a few hundred KiB, so that every call streams its operands from the bucket.
Bounds as in ``tests/engine/test_cluster_coverage.py`` (Higham 2002; ``support.tolerances``).
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import scipy.linalg as sl

import blocklin
from support.tolerances import (assert_factorization, assert_gram, assert_orthonormal, assert_product, assert_solve,
                                assert_singular_values, eps, fro_norm)

F64 = eps(np.float64)
RNG = np.random.default_rng(17)
N = 72
G = RNG.standard_normal((N, N))
SPD = G @ G.T / N + np.eye(N)
SQ = G + 8 * np.eye(N)
TALL = RNG.standard_normal((240, 16)) * np.logspace(0, -1, 16) + 2.0
RHS = RNG.standard_normal((N, 3))


@pytest.fixture(scope="module")
def bucket(s3_server):
    """The module's inputs written once to a fresh bucket: ``(url(name), opts)``."""
    import s3fs

    opts = dict(s3_server)
    base = f"s3://blocklin-{uuid.uuid4().hex[:10]}"
    s3fs.S3FileSystem(**opts).mkdir(base[5:])
    for name, x, ch in (("spd", SPD, (18, 18)), ("sq", SQ, (18, 18)), ("tall", TALL, (40, 16)),
                        ("rhs", RHS, (18, 3)), ("sq32", SQ.astype(np.float32), (18, 18))):
        blocklin.from_array(x, f"{base}/{name}.zarr", chunks=ch, storage_options=opts)

    def url(name):
        return f"{base}/{name}.zarr"
    return url, opts


def test_factorizations_to_s3(bucket):
    url, opts = bucket
    kw = {"memory": "192KiB", "storage_options": opts}
    L = blocklin.cholesky(url("spd"), url("out-l"), **kw)
    assert L.path == url("out-l")
    L = L.to_numpy()
    assert_factorization(SPD, L @ L.T, factors=(L, L))
    f = blocklin.lu(url("sq"), url("out-lu"), **kw)
    lu_ref, piv_ref = sl.lu_factor(SQ)
    assert np.array_equal(f.report["pivots"], piv_ref)
    lu = f.to_numpy()
    lo, up = np.tril(lu, -1) + np.eye(N), np.triu(lu)
    assert_factorization(SQ, _permuted(lo @ up, piv_ref), factors=(lo, up))
    q, r = blocklin.qr(url("tall"), url("out-r"), q=url("out-q"), mode="reduced", memory="512KiB",
                       storage_options=opts)
    q, r = q.to_numpy(), r.to_numpy()
    assert_factorization(TALL, q @ r, const=4.0)
    assert_orthonormal(q, const=4.0)


def _permuted(lu_product, piv):
    """``P^T (L U)``: undo LAPACK's row interchanges ``piv`` (applied in order) on the product."""
    out = lu_product.copy()
    for i in reversed(range(len(piv))):
        out[[i, piv[i]]] = out[[piv[i], i]]
    return out


def test_solves_from_s3(bucket):
    url, opts = bucket
    kw = {"memory": "192KiB", "tile": 18, "storage_options": opts}
    t = np.tril(SQ)
    blocklin.from_array(t, url("t"), chunks=(18, 18), storage_options=opts)
    x = blocklin.solve_triangular(url("t"), url("rhs"), url("out-xt"), lower=True, **kw)
    assert_solve(x.to_numpy(), sl.solve_triangular(t, RHS, lower=True), t)
    blocklin.from_array(sl.cholesky(SPD, lower=True), url("c"), chunks=(18, 18), storage_options=opts)
    x = blocklin.cho_solve(url("c"), url("rhs"), url("out-xc"), lower=True, **kw)
    assert_solve(x.to_numpy(), np.linalg.solve(SPD, RHS), SPD)
    lu, piv = sl.lu_factor(SQ)
    blocklin.from_array(lu, url("lu"), chunks=(18, 18), storage_options=opts)
    x = blocklin.lu_solve(url("lu"), url("rhs"), url("out-xl"), piv=piv, **kw)
    assert_solve(x.to_numpy(), np.linalg.solve(SQ, RHS), SQ)
    x = blocklin.solve(url("sq"), url("rhs"), out=url("out-xs"), memory="192KiB", storage_options=opts)
    assert_solve(x.to_numpy(), np.linalg.solve(SQ, RHS), SQ)


def test_lstsq_and_pca_from_s3(bucket):
    url, opts = bucket
    b = RHS[:, :1].repeat(4, axis=0)[:240]
    blocklin.from_array(b, url("b240"), chunks=(40, 1), storage_options=opts)
    x, _, rank, s = blocklin.lstsq(url("tall"), url("b240"), memory="256KiB", storage_options=opts)
    ref, _, ref_rank, ref_s = np.linalg.lstsq(TALL, b, rcond=None)
    x = x.to_numpy() if isinstance(x, blocklin.Matrix) else np.asarray(x)
    assert rank == ref_rank
    assert_singular_values(s, ref_s, n=240)
    kappa = ref_s[0] / ref_s[-1]
    r = fro_norm(TALL @ ref - b)
    assert fro_norm(x - ref) <= 8 * 240 * F64 * (kappa * fro_norm(ref) + kappa ** 2 * r / ref_s[0])
    p = blocklin.pca(url("tall"), 16, memory="256KiB", storage_options=opts, seed=0)
    centered = TALL - TALL.mean(axis=0)
    ref_sv = np.linalg.svd(centered, compute_uv=False)
    # the centered data's singular values (Weyl, rounded at the size of the data with its means)
    assert_singular_values(p.singular_values_, ref_sv, n=240, s1=np.linalg.norm(TALL, 2))


def test_norms_and_determinants_from_s3(bucket):
    url, opts = bucket
    kw = {"memory": "2MiB", "storage_options": opts}
    for o in (None, 1, -1, np.inf, -np.inf):
        t = SQ.size if o is None else N
        ref = np.linalg.norm(SQ, o)
        assert abs(blocklin.norm(url("sq"), o, **kw) - ref) <= 2 * t * F64 * ref, o
    s = np.linalg.svd(SQ, compute_uv=False)
    assert abs(blocklin.norm(url("sq"), -2, **kw) - s[-1]) <= 4 * N * F64 * s[0]
    assert abs(blocklin.norm(url("sq"), "nuc", **kw) - s.sum()) <= N * 4 * N * F64 * s[0]
    kappa = s[0] / s[-1]
    assert abs(blocklin.cond(url("sq"), **kw) - kappa) <= 4 * N * F64 * (1 + kappa) * kappa
    sign, logdet = blocklin.slogdet(url("sq"), **kw)
    ref = np.linalg.slogdet(SQ)
    bound = N * np.linalg.norm(np.linalg.inv(SQ), 2) * 2 * N * F64 * np.linalg.norm(SQ) * 2
    assert sign == ref.sign and abs(logdet - ref.logabsdet) <= bound


def test_linear_operator_from_s3(bucket):
    url, opts = bucket
    op = blocklin.aslinearoperator(url("tall"), memory="256KiB", storage_options=opts)
    x = RNG.standard_normal((16, 2))
    y = RNG.standard_normal((240, 2))
    assert_product(op.matmat(x), TALL @ x, TALL, x)
    assert_product(op.rmatmat(y), TALL.T @ y, TALL.T, y)


def test_append_to_s3_then_update(bucket):
    """Rows appended to a matrix in the bucket (a panel from another S3 store and one from memory), the
    Gram matrix computed before brought up to date by ``update`` reading the new rows."""
    url, opts = bucket
    rng = np.random.default_rng(3)
    top = rng.standard_normal((50, 12))
    more = rng.standard_normal((23, 12))
    last = rng.standard_normal((9, 12))
    blocklin.from_array(top, url("g-a"), chunks=(20, 12), storage_options=opts)
    blocklin.from_array(more, url("g-rows"), chunks=(20, 12), storage_options=opts)
    g = blocklin.gram(url("g-a"), url("g-gram"), memory="256KiB", storage_options=opts)
    assert_gram(g.to_numpy(), top.T @ top, top)
    m = blocklin.append(url("g-a"), url("g-rows"), memory="128KiB", storage_options=opts)
    assert m.shape == (73, 12)
    m = blocklin.append(url("g-a"), last, memory="128KiB", storage_options=opts)
    full = np.vstack([top, more, last])
    assert np.array_equal(blocklin.open(url("g-a"), storage_options=opts).to_numpy(), full)
    assert blocklin.rollback_append(url("g-a"), storage_options=opts)["interrupted"] is False
    u = blocklin.update(url("g-gram"), memory="256KiB", storage_options=opts)
    assert_gram(u.to_numpy(), full.T @ full, full)


def test_numpy_protocol_on_matrices_opened_from_s3(bucket):
    url, opts = bucket
    A = blocklin.open(url("sq"), storage_options=opts)
    B = blocklin.open(url("rhs"), storage_options=opts)
    with blocklin.config.set(memory="256KiB", storage_options=opts):
        c = A @ B
        assert_product(c.to_numpy(), SQ @ RHS, SQ, RHS)
        v = np.ones(N) @ A
        assert_product(v, np.ones(N) @ SQ, SQ.T, np.ones((N, 1)))
        x = np.linalg.solve(A, B)
        assert_solve(x.to_numpy(), np.linalg.solve(SQ, RHS), SQ)
        assert_solve(np.linalg.inv(A).to_numpy(), np.linalg.inv(SQ), SQ)
        assert abs(np.linalg.norm(A) - np.linalg.norm(SQ)) <= 2 * SQ.size * F64 * np.linalg.norm(SQ)
        # float32 A with a float64 b: NumPy solves in float64, on a float64 copy of A made from the bucket
        A32 = blocklin.open(url("sq32"), storage_options=opts)
        sq32 = SQ.astype(np.float32).astype(np.float64)
        x = np.linalg.solve(A32, RHS[:, 0])
        assert x.dtype == np.float64
        assert_solve(x, np.linalg.solve(sq32, RHS[:, 0]), sq32)
        with blocklin.config.set(memory="2MiB"):  # its SVD holds N x N factors
            xl = np.linalg.lstsq(A32, RHS, rcond=None)[0]
        xl = xl.to_numpy() if isinstance(xl, blocklin.Matrix) else np.asarray(xl)
        assert xl.dtype == np.float64
        assert_solve(xl, np.linalg.solve(sq32, RHS), sq32)


def test_square_solve_from_s3_takes_the_lu_route(bucket):
    """A square ``A`` in the bucket, its ``storage_options`` given to the call: ``solve`` runs LU with
    partial pivoting (``cond(A)``), as for a local ``A``. The route is chosen from the operand's shape,
    read without the call's options, so ``A`` had gone to the least-squares route of the normal
    equations (``cond(A)^2``, here ``10^20``: beyond float64)."""
    url, opts = bucket
    a = _graded_square(N, 1e10, seed=8)
    blocklin.from_array(a, url("graded"), chunks=(18, 18), storage_options=opts)
    x = blocklin.solve(url("graded"), url("rhs"), memory="192KiB", storage_options=opts)
    assert x.report["method"] == "lu", x.report["method"]
    assert_solve(x.to_numpy(), np.linalg.solve(a, RHS), a)


def _graded_square(n, kappa, seed):
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((n, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return (u * np.logspace(0, -np.log10(kappa), n)) @ v.T


def test_half_precision_inverse_from_s3(bucket):
    """``inv(precision='bf16')`` of a square ``A`` in the bucket, read with the call's options: the inverse
    (GMRES-IR refined to float64's backward error, so the float64 forward bound of a solve holds)."""
    url, opts = bucket
    x = blocklin.inv(url("sq"), precision="bf16", memory="1MiB", storage_options=opts)
    assert x.shape == (N, N)
    assert_solve(x.to_numpy(), np.linalg.inv(SQ), SQ)


def test_factored_solves_read_what_blocklin_recorded_on_s3(bucket):
    """``cho_solve`` and ``lu_solve`` of blocklin's own factors in the bucket, named by URL with the call's
    ``storage_options``: the recorded triangle and pivots are read with those options. Read without
    them, an upper factor was solved as lower (its zero triangle: ``x`` off by 0.5, without a word) and
    ``lu_solve`` asked for ``piv`` "for factors blocklin.lu did not write"."""
    url, opts = bucket
    kw = {"memory": "192KiB", "storage_options": opts}
    blocklin.cholesky(url("spd"), url("out-u"), lower=False, **kw)
    x = blocklin.cho_solve(url("out-u"), url("rhs"), **kw)
    assert_solve(x.to_numpy(), np.linalg.solve(SPD, RHS), SPD)
    blocklin.lu(url("sq"), url("out-lu2"), **kw)
    x = blocklin.lu_solve(url("out-lu2"), url("rhs"), **kw)
    assert_solve(x.to_numpy(), np.linalg.solve(SQ, RHS), SQ)


def test_sparse_rows_from_s3_appended_to_a_local_sparse_matrix(bucket, tmp_path):
    """A ``blocklin-csr`` group of rows in the bucket, its ``storage_options`` given to the call, appended
    to a local sparse matrix: the result is ``vstack([S, R])`` entry for entry (the CSR arrays are copied,
    no arithmetic). The sparse route took the URL without the call's options, so the rows were not
    seen to be sparse and were refused as 'must be sparse ... (zarr)'."""
    import s3fs
    import scipy.sparse

    url, opts = bucket
    s = scipy.sparse.random(20, 8, density=0.3, random_state=1, format="csr")
    r = scipy.sparse.random(5, 8, density=0.3, random_state=2, format="csr")
    blocklin.from_sparse(s, tmp_path / "s.zarr")
    blocklin.from_sparse(r, tmp_path / "r.zarr")
    s3fs.S3FileSystem(**opts).put(str(tmp_path / "r.zarr"), url("sparse-rows")[5:], recursive=True)
    out = blocklin.append(tmp_path / "s.zarr", url("sparse-rows"), storage_options=opts)
    assert out.shape == (25, 8)
    np.testing.assert_array_equal(out.to_scipy().toarray(), scipy.sparse.vstack([s, r]).toarray())


def test_sample_weight_at_a_url_with_the_calls_options(bucket):
    """``sample_weight`` given as a URL (as ``blocklin solve --sample-weight W.zarr`` passes it), read with the
    call's ``storage_options`` like ``a`` and ``b``: ``x`` is scikit-learn's ``Ridge(alpha=lam^2)`` fit with
    those weights, within ``support.ridge.coef_bound`` (the weighted normal equations' forward error), for a
    tall ``A`` in the bucket. A path or URL had been refused as a scalar weight."""
    from sklearn.linear_model import Ridge

    from support.ridge import coef_bound, weights

    url, opts = bucket
    w = weights(TALL.shape[0], seed=3)
    b = np.random.default_rng(23).standard_normal((TALL.shape[0], 2))
    blocklin.from_array(w[:, None], url("w"), chunks=(40, 1), storage_options=opts)
    blocklin.from_array(b, url("b-tall"), chunks=(40, 2), storage_options=opts)
    x = blocklin.solve(url("tall"), url("b-tall"), lam=0.5, sample_weight=url("w"), memory="192KiB",
                       storage_options=opts)
    assert x.report["sample_weight"] is True
    ref = Ridge(alpha=0.25, fit_intercept=False, solver="svd").fit(TALL, b, sample_weight=w).coef_
    assert np.linalg.norm(x.to_numpy().T - ref) <= coef_bound(TALL, b, w, 0.5, False, np.float64, ref)


def test_delete_of_results_in_the_bucket_without_a_stored_factor(bucket):
    """``delete()`` of an ``svd`` (``return_singular_vectors="vh"``: no stored factor returned) and an
    ``eigsh`` (its vectors in memory) written to the bucket, with the call's ``storage_options``: the
    groups are removed. Found from the report's URL alone, they had been opened without the options
    (botocore's ``NoCredentialsError``) and left in place. The values returned stay usable: the singular
    values against NumPy's (Weyl, the Gram route's bound), the eigenpairs the same bits as those of the
    same call on the matrix in memory (tests/storage/test_s3.py's check)."""
    import s3fs

    url, opts = bucket
    fs = s3fs.S3FileSystem(**opts)
    res = blocklin.svd(url("tall"), 3, out=url("svd-vh"), return_singular_vectors="vh", seed=0, storage_options=opts)
    assert res.U is None and fs.exists(url("svd-vh")[5:])
    res.delete()
    assert not fs.exists(url("svd-vh")[5:])
    assert_singular_values(res.s, np.linalg.svd(TALL, compute_uv=False)[:3], n=TALL.shape[0], gram=True)
    eig = blocklin.eigsh(url("spd"), 2, out=url("eig"), seed=0, order="ascending", storage_options=opts)
    assert fs.exists(url("eig")[5:])
    eig.delete()
    assert not fs.exists(url("eig")[5:])
    ref = blocklin.eigsh(SPD, 2, seed=0, order="ascending")
    np.testing.assert_array_equal(eig.w, ref.w)
    np.testing.assert_array_equal(eig.V, ref.V)
    cov = blocklin.eigsh(url("tall"), 2, center=True, out=url("cov"), seed=0, order="ascending", storage_options=opts)
    assert fs.exists(url("cov")[5:])
    cov.delete()  # the covariance's eigenpairs, from the centered svd's group
    assert not fs.exists(url("cov")[5:])
    np.testing.assert_array_equal(cov.w, blocklin.eigsh(TALL, 2, center=True, seed=0, order="ascending").w)
