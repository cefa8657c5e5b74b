"""Products of a stored sparse matrix (``blocklin-csr``) with dense ones: ``S B``, ``S^T B`` (matmul)
and ``S^T S`` (gram), against SciPy's in-memory products.

Bounds from :mod:`support.tolerances`: a product's error is at most ``c k eps |A| |B|`` with ``k``
the entries summed per output element; for ``S B`` that is at most the most entries of a row of
``S``, for ``S^T B`` and ``S^T S`` the most entries of a column, so the dense ``S`` passed to
:func:`assert_product` carries ``k = n`` or ``m`` (an upper bound of both).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse

import blocklin as bl
from blocklin.errors import BudgetError, DTypeError, ParameterError, ShapeError
from support.tolerances import assert_gram, assert_product, eps


def _sparse(m: int, n: int, seed: int, dtype=np.float64, density: float = 0.05) -> scipy.sparse.csr_matrix:
    return scipy.sparse.random(m, n, density=density, random_state=seed, format="csr", dtype=dtype)


@pytest.fixture
def stored(tmp_path):
    """A 700 x 90 sparse matrix with all-zero rows 100:400 (whole empty row blocks) and a zero column."""
    x = _sparse(700, 90, 3).tolil()
    x[100:400] = 0
    x[:, 7] = 0
    x = x.tocsr()
    x.eliminate_zeros()
    return x, bl.from_sparse(x, tmp_path / "s.zarr")


@pytest.mark.parametrize("scheduler", ["sync", "threads"])
def test_s_times_b(stored, rng, tmp_path, scheduler):
    x, s = stored
    b = rng.standard_normal((90, 7))
    c = bl.matmul(s, b, tmp_path / "c.zarr", scheduler=scheduler, memory="1MiB")
    assert c.shape == (700, 7) and c.dtype == np.float64
    assert_product(c.to_numpy(), x @ b, x.toarray(), b)
    r = c.report
    assert r["nnz"] == x.nnz and r["flops"] == 2 * x.nnz * 7 and r["bytes_read"] > 0 and r["seconds"] > 0


@pytest.mark.parametrize("scheduler", ["sync", "threads", "processes"])
def test_s_transposed_times_b(stored, rng, tmp_path, scheduler):
    x, s = stored
    y = rng.standard_normal((700, 5))
    d = bl.matmul(s.path, y, tmp_path / "d.zarr", trans_a=True, scheduler=scheduler, memory="1MiB")
    assert d.shape == (90, 5)
    assert_product(d.to_numpy(), x.T @ y, x.toarray().T, y)
    assert d.report["flops"] == 2 * x.nnz * 5 and d.report["nnz"] == x.nnz


def test_bits_do_not_depend_on_the_scheduler_and_small_budgets_tile(stored, rng, tmp_path):
    x, s = stored
    y = rng.standard_normal((700, 40))
    runs = [bl.matmul(s, y, tmp_path / f"t{i}.zarr", trans_a=True, scheduler=sched, memory="192KiB", workers=w)
            for i, (sched, w) in enumerate([("sync", 1), ("threads", 2)])]
    plan = runs[0].report["plan"]
    assert plan["n_tasks"] > 1 and plan["rows"] < 700  # tiles and strips: bounded memory
    assert np.array_equal(runs[0].to_numpy(), runs[1].to_numpy())
    assert_product(runs[0].to_numpy(), x.T @ y, x.toarray().T, y)
    # S B with B in panels of rows and S in pieces of entries
    b = rng.standard_normal((90, 300))
    c = bl.matmul(s, b, tmp_path / "c.zarr", memory="256KiB")
    assert c.report["plan"]["n_tasks"] > 1
    assert_product(c.to_numpy(), x @ b, x.toarray(), b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtypes_and_a_stored_dense_b(tmp_path, rng, dtype):
    x = _sparse(300, 50, 5, dtype=dtype, density=0.1)
    s = bl.from_sparse(x, tmp_path / "s.zarr")
    b = rng.standard_normal((50, 4)).astype(dtype)
    stored_b = bl.matmul(np.eye(50, dtype=dtype), b, tmp_path / "b.zarr")  # a stored dense operand: B itself
    c = bl.matmul(s, stored_b, tmp_path / "c.zarr")
    assert c.dtype == dtype
    assert_product(c.to_numpy(), x.astype(np.float64) @ b.astype(np.float64), x.toarray(), b, dtype=dtype)
    g = bl.gram(s)  # summed in float64, stored in the dtype
    assert g.dtype == dtype
    assert_gram(g.to_numpy(), (x.T @ x).astype(np.float64).toarray(), x.toarray(), dtype=dtype)
    with pytest.raises(DTypeError, match="operands must share one dtype"):
        bl.matmul(s, b.astype(np.float64 if dtype == np.float32 else np.float32))


def test_sparse_gram(stored, tmp_path):
    x, s = stored
    g = bl.gram(s, tmp_path / "g.zarr", memory="2MiB")
    assert g.shape == (90, 90) and g.report["route"] == "sparse" and g.report["passes"] == 1
    ref = (x.T @ x).toarray()
    assert_gram(g.to_numpy(), ref, x.toarray())
    g2 = bl.gram(s.path, tmp_path / "g2.zarr", scheduler="processes", memory="2MiB")
    assert np.array_equal(g.to_numpy(), g2.to_numpy())
    h = bl.matmul(s, s.path, trans_a=True)  # S^T S named as a product: the same pass
    assert h.report["route"] == "sparse" and np.array_equal(h.to_numpy(), g.to_numpy())
    with pytest.raises(ParameterError, match=r"a stored sparse matrix takes gram\(S, out, dtype=...\) only.*with trans"):
        bl.gram(s, trans=True)
    with pytest.raises(BudgetError, match=r"memory: must hold .*S\^T S.*Fix: pass memory='") as info:
        bl.gram(s, memory="64KiB")
    assert info.value.minimum > 64 * 1024


def test_refusals_name_the_rule_and_the_fix(stored, rng):
    x, s = stored
    with pytest.raises(ShapeError, match=r"b: rows of b must equal the columns of the sparse a.*700 x 90.*"
                                         r"b 89 x 3.*Fix: pass b with 90 rows"):
        bl.matmul(s, rng.standard_normal((89, 3)))
    with pytest.raises(ShapeError, match=r"rows of b must equal the rows of the sparse a .*S\^T B"):
        bl.matmul(s, rng.standard_normal((90, 3)), trans_a=True)
    with pytest.raises(BudgetError, match=r"memory: must hold one task of the sparse product S B.*"
                                          r"Fix: pass memory='.*' or more") as info:
        bl.matmul(s, rng.standard_normal((90, 3)), memory="16KiB")
    assert info.value.minimum > 16 * 1024
    with pytest.raises(ParameterError, match=r"a stored sparse matrix takes matmul\(S, B, out.*with c, beta, trans_b"):
        bl.matmul(s, rng.standard_normal((3, 90)), c=np.zeros((700, 3)), beta=1.0, trans_b=True)
    with pytest.raises(ShapeError, match=r"a: the columns of the dense a must equal the rows of the sparse b "
                                         r"\(X S; no broadcasting\); got a 4 x 699 and b 700 x 90.*"
                                         r"Fix: pass a with 700 columns"):
        bl.matmul(rng.standard_normal((4, 699)), s)
    with pytest.raises(ParameterError, match=r"a stored sparse matrix takes matmul\(A, S, out.*with c, beta"):
        bl.matmul(rng.standard_normal((4, 700)), s, c=np.zeros((4, 90)), beta=1.0)


@pytest.mark.parametrize("trans_a", [False, True], ids=["X", "XT"])
@pytest.mark.parametrize("trans_b", [False, True], ids=["S", "ST"])
def test_dense_left_operand(stored, rng, tmp_path, trans_a, trans_b):
    """op(X) op(S), computed as (op(S)^T op(X)^T)^T: the same tiles, X read across, each tile written
    across; its entries are sums over S's columns (or rows), bounded as the module says."""
    x, s = stored
    inner = 90 if trans_b else 700
    X = rng.standard_normal((6, inner))
    sd = x.toarray().T if trans_b else x.toarray()
    c = bl.matmul(X.T.copy() if trans_a else X, s, tmp_path / "c.zarr", trans_a=trans_a, trans_b=trans_b,
                  memory="256KiB")
    assert c.shape == (6, sd.shape[1]) and c.report["product"] == ("X^T" if trans_a else "X") + (" S^T" if trans_b
                                                                                                 else " S")
    assert_product(c.to_numpy(), X @ sd, X, sd)
    assert c.report["flops"] == 2 * x.nnz * 6


def test_dense_left_bits_do_not_depend_on_the_scheduler(stored, rng, tmp_path):
    x, s = stored
    X = rng.standard_normal((200, 700))
    runs = [bl.matmul(X, s, tmp_path / f"l{i}.zarr", scheduler=sched, memory="192KiB", workers=w)
            for i, (sched, w) in enumerate([("sync", 1), ("threads", 2), ("processes", 2)])]
    assert runs[0].report["tasks"] > 1
    assert all(np.array_equal(r.to_numpy(), runs[0].to_numpy()) for r in runs[1:])
    plan = bl.matmul(X, s, memory="192KiB", explain=True)
    assert plan.nnz == x.nnz


def test_resume_and_overwrite_follow_every_output(stored, rng, tmp_path):
    x, s = stored
    b = rng.standard_normal((90, 3))
    out = tmp_path / "c.zarr"
    bl.matmul(s, b, out)
    from blocklin.errors import BlocklinError

    with pytest.raises(BlocklinError, match="overwrite"):
        bl.matmul(s, b, out)
    c = bl.matmul(s, 2 * b, out, overwrite=True)
    assert_product(c.to_numpy(), x @ (2 * b), x.toarray(), 2 * b)


@pytest.mark.slow
def test_on_a_local_cluster(stored, rng, tmp_path, client):
    x, s = stored
    y = rng.standard_normal((700, 3))
    d = bl.matmul(s, y, tmp_path / "d.zarr", trans_a=True, scheduler=client, memory="1MiB")
    assert_product(d.to_numpy(), x.T @ y, x.toarray().T, y)
    c = bl.matmul(s, y[:90], tmp_path / "c.zarr", scheduler=client, memory="1MiB")
    assert_product(c.to_numpy(), x @ y[:90], x.toarray(), y[:90])
    g = bl.gram(s, tmp_path / "g.zarr", scheduler=client, memory="2MiB")
    assert_gram(g.to_numpy(), (x.T @ x).toarray(), x.toarray())


def test_nan_in_s_or_b_is_refused(tmp_path, rng):
    from blocklin.errors import NonFiniteError

    x = _sparse(50, 8, 1, density=0.3)
    x.data[3] = np.nan
    s = bl.from_sparse(x, tmp_path / "s.zarr")
    with pytest.raises(NonFiniteError, match="a: must hold finite values"):
        bl.matmul(s, rng.standard_normal((8, 2)))
    t = bl.from_sparse(_sparse(50, 8, 2, density=0.3), tmp_path / "t.zarr")
    b = rng.standard_normal((50, 2))
    b[4, 1] = np.inf
    with pytest.raises(NonFiniteError, match="b: must hold finite values"):
        bl.matmul(t, b, trans_a=True)


def test_cli_gemm_and_gram_of_a_sparse_store(stored, rng, tmp_path, capsys):
    import json

    from blocklin.cli.main import main

    x, s = stored
    b = rng.standard_normal((90, 3))
    stored_b = bl.matmul(np.eye(90), b, tmp_path / "b.zarr")
    assert main(["gemm", s.path, stored_b.path, "-o", str(tmp_path / "c.zarr"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["shape"] == [700, 3] and summary["flops"] == 2 * x.nnz * 3
    assert_product(bl.open(tmp_path / "c.zarr").to_numpy(), x @ b, x.toarray(), b)
    assert main(["gram", s.path, "-o", str(tmp_path / "g.zarr"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["shape"] == [90, 90]
    assert_gram(bl.open(tmp_path / "g.zarr").to_numpy(), (x.T @ x).toarray(), x.toarray())


@pytest.mark.parametrize("k", [300, -300, 0])
def test_sparse_gram_near_the_range_ends_is_the_scaled_gram(stored, tmp_path, k):
    """A Gram in float64's range is summed without overflow or lost digits (its diagonal holds the largest
    squares), so the Gram of ``2^k S`` is ``4^k`` times that of ``S``, bits and all, with the range check
    below in place; one row far above the rest gives a finite Gram within the product bound."""
    x, s = stored
    ref = bl.gram(s, tmp_path / "g.zarr", memory="2MiB").to_numpy()
    y = x.copy()
    y.data = np.ldexp(y.data, k)
    got = bl.gram(bl.from_sparse(y, tmp_path / "y.zarr"), tmp_path / "gy.zarr", memory="2MiB").to_numpy()
    assert np.array_equal(np.ldexp(got, -2 * k), ref)
    # one row far above the rest: a later row block raises the scaling, the sum so far is rescaled
    z = x.tolil()
    z[650, :] = z[650, :] * 2.0 ** 500
    z = z.tocsr()
    g = bl.gram(bl.from_sparse(z, tmp_path / "z.zarr"), tmp_path / "gz.zarr", memory="2MiB").to_numpy()
    assert np.isfinite(g).all()
    assert_gram(np.ldexp(g, -1000), np.ldexp((z.T @ z).toarray(), -1000), np.ldexp(z.toarray(), -500))


@pytest.mark.parametrize("k,dtype", [(600, np.float64), (-600, np.float64), (70, np.float32)])
def test_a_sparse_gram_beyond_the_range_is_refused_with_the_scaling_that_fits(stored, tmp_path, k, dtype):
    """Entries near ``2^+-600`` (float32's ``2^70``) had given a Gram of ``inf`` or ``0`` without an error
    (found by a randomized search, 2026-12-06), where the dense route refuses; so does the sparse one now,
    naming a power of two whose scaled data's Gram fits."""
    x, _ = stored
    y = x.astype(np.float64)
    y.data = np.ldexp(y.data, k)
    y = y.astype(dtype)
    with pytest.raises(ParameterError, match=r"^a: must have a Gram matrix within the range of") as err:
        bl.gram(bl.from_sparse(y, tmp_path / "y.zarr"), memory="2MiB")
    j = int(str(err.value).split("times 2.0**")[1].split(" ")[0])  # the fix names the power of two
    z = y.astype(np.float64)
    z.data = np.ldexp(z.data, j)
    g = bl.gram(bl.from_sparse(z.astype(dtype), tmp_path / "z.zarr"), memory="2MiB").to_numpy()
    assert np.isfinite(g).all() and np.abs(g).max() > 0


@pytest.mark.parametrize("k,dtype", [(-500, np.float64), (-60, np.float32)])
def test_a_sparse_gram_whose_largest_entry_is_normal_is_kept(stored, tmp_path, k, dtype):
    """Entries near ``2^-500`` (float32's ``2^-60``) give a Gram near ``2^-997`` (``2^-117``): normal numbers,
    which the dense ``gram`` returns (docs/gemm.md), but below ``2^(minexp + nmant)``, where the sparse one
    had refused them. Kept now, refused only where the largest entry is subnormal (every entry below the
    normal numbers). Against the Gram of the data scaled by ``2^-k`` (exact) in float64, compared in those
    units (``2^-2k`` times the result, exact): ``2 m eps ||S||_F^2`` (:func:`support.tolerances.assert_gram`)
    plus the underflow of each of an entry's ``m`` products and of its rounding to ``dtype``, at most
    ``u 2^minexp`` each (Higham 2002, eq. 2.8), ``n (m + 1) u 2^minexp`` in the Frobenius norm."""
    x, _ = stored
    y = x.astype(np.float64)
    y.data = np.ldexp(y.data, k)
    y = y.astype(dtype)
    g = bl.gram(bl.from_sparse(y, tmp_path / "y.zarr"), memory="2MiB").to_numpy()
    fi = np.finfo(dtype)
    assert g.dtype == dtype and float(np.abs(g).max()) < 2.0 ** (fi.minexp + fi.nmant)  # the range once refused
    z = y.astype(np.float64)
    z.data = np.ldexp(z.data, -k)
    zd = z.toarray()
    m, n = zd.shape
    assert_gram(np.ldexp(g.astype(np.float64), -2 * k), zd.T @ zd, zd, dtype=dtype,
                extra=n * (m + 1) * np.ldexp(1.0, fi.minexp - fi.nmant - 1 - 2 * k))


@pytest.mark.parametrize("product", ["S B", "S^T B", "X S"])
def test_a_sparse_product_beyond_the_range_is_refused(stored, tmp_path, product):
    """Finite entries near 1e200 whose sums overflow had given an output of Inf and NaN without an error,
    where the dense product refuses: each tile is checked before it is written, the refusal names the
    entry, no output is left, and ``check_finite=False`` keeps the product as computed (SciPy's)."""
    x, _ = stored
    y = x * 1e200
    s = bl.from_sparse(y, tmp_path / "y.zarr")
    b = np.full((90 if product == "S B" else 700, 3), 1e200)
    args = {"S B": (s, b), "S^T B": (s, b), "X S": (b.T, s)}[product]
    kw = {"trans_a": True} if product == "S^T B" else {}
    with pytest.raises(ParameterError, match=r"^a: must give a product within float64's range.*sums are not; got "
                                             r"(inf|-inf|nan) at row \d+, column \d+ of the output"):
        bl.matmul(*args, tmp_path / "c.zarr", memory="1MiB", **kw)
    assert not (tmp_path / "c.zarr").exists() and not list(tmp_path.glob(".c.zarr*"))
    ref = {"S B": lambda: y @ b, "S^T B": lambda: y.T @ b, "X S": lambda: (y.T @ b).T}[product]()
    with np.errstate(over="ignore", invalid="ignore"):
        got = bl.matmul(*args, memory="1MiB", check_finite=False, **kw).to_numpy()
    assert not np.isfinite(ref).all() and np.array_equal(np.isfinite(got), np.isfinite(ref))


@pytest.mark.parametrize("dtype,e", [(np.float64, -600), (np.float64, -530), (np.float32, -80)])
@pytest.mark.parametrize("product", ["S B", "S^T B", "X S"])
def test_a_sparse_product_below_the_normal_numbers_is_refused(stored, tmp_path, product, dtype, e):
    """Entries near 2^-600 (float64; 2^-80 in float32) whose every term lies below the normal numbers had
    given a zero product, and near 2^-530 one of few digits, silently, as the dense product had: refused as
    it is now (``k max|s| max|b|`` below 2^minexp), no output left, the scalings it names give the product in
    range; ``check_finite=False`` keeps it as computed."""
    import re

    x, _ = stored
    y = x.astype(dtype)
    y.data = np.ldexp(y.data, e).astype(dtype)
    s = bl.from_sparse(y, tmp_path / "y.zarr")
    b = np.ldexp(np.random.default_rng(5).standard_normal((90 if product == "S B" else 700, 3)), e).astype(dtype)
    kw = {"trans_a": True} if product == "S^T B" else {}
    args = {"S B": (s, b), "S^T B": (s, b), "X S": (b.T, s)}[product]
    with pytest.raises(ParameterError, match=rf"^a: must give a product within {np.dtype(dtype).name}'s normal "
                                             r"range .*got a product whose entries are all below 2\^-\d+") as err:
        bl.matmul(*args, tmp_path / "c.zarr", memory="1MiB", **kw)
    assert not (tmp_path / "c.zarr").exists() and not list(tmp_path.glob(".c.zarr*"))
    pa, pb, p = (int(g) for g in re.search(r"sparse matrix by 2\^(\d+) .*dense operand by 2\^(\d+) .*then "
                                           r"2\^(\d+) times", str(err.value)).groups())
    assert pa + pb == p
    z = y.copy()
    z.data = np.ldexp(y.data, pa)
    zs, bz = bl.from_sparse(z, tmp_path / "z.zarr"), np.ldexp(b, pb)
    got = bl.matmul(*({"S B": (zs, bz), "S^T B": (zs, bz), "X S": (bz.T, zs)}[product]), memory="1MiB", **kw)
    z64, b64 = z.astype(np.float64).toarray(), bz.astype(np.float64)
    ref = {"S B": lambda: z64 @ b64, "S^T B": lambda: z64.T @ b64, "X S": lambda: b64.T @ z64}[product]()
    ops = {"S B": (z64, b64), "S^T B": (z64.T, b64), "X S": (b64.T, z64)}[product]
    assert_product(got.to_numpy(), ref, *ops, dtype=dtype)
    bl.matmul(*args, memory="1MiB", check_finite=False, **kw)  # unchecked: as computed


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("product", ["S B", "S^T B", "X S", "X S^T"])
def test_a_sparse_product_of_few_entries_per_row_below_the_normal_numbers_is_refused(tmp_path, product, dtype):
    """Rows (columns, for ``S^T B``) of 2 entries out of ``k = 4096``: ``k max|s| max|b|`` reaches the normal
    numbers, but every entry is a sum of 2 terms, below ``2 max|s| max|b| < 2^minexp``, so the product was a
    matrix of subnormals of few digits, returned without a word (float64 near ``2^-1034``, ``1e-12`` off, up to
    ``8e-11``; float32 near ``2^-138``, ``5e-4``, up to ``1.5e-2``), against the reference computed on operands scaled by exact powers of
    two. Refused now by the bound of the most entries of a row (column), naming the scalings, which give the
    product within the usual bound; ``check_finite=False`` keeps it as computed."""
    import re

    fi = np.finfo(dtype)
    es, eb = fi.minexp // 2 - 1, fi.minexp // 2 - 13  # max|s| max|b| near 2^(minexp - 12), k = 2^12
    rng = np.random.default_rng(21)
    rows = np.repeat(np.arange(64), 2)
    p = scipy.sparse.csr_matrix((rng.uniform(1, 2, 128) * rng.choice([-1, 1], 128), (rows, np.arange(128) * 32)),
                                shape=(64, 4096))  # 2 entries a row, 1 a column: the 2 a row of S or of S^T
    y = (p if product in ("S B", "X S^T") else p.T.tocsr()).astype(dtype)
    y.data = np.ldexp(y.data, es).astype(dtype)
    s = bl.from_sparse(y, tmp_path / "y.zarr")
    dense = np.ldexp(rng.standard_normal((4096, 3)), eb).astype(dtype)
    args = {"S B": (s, dense), "S^T B": (s, dense), "X S": (dense.T, s), "X S^T": (dense.T, s)}[product]
    kw = {"S^T B": {"trans_a": True}, "X S^T": {"trans_b": True}}.get(product, {})
    y64, d64 = np.ldexp(y.astype(np.float64).toarray(), -es), np.ldexp(dense.astype(np.float64), -eb)
    ops = {"S B": (y64, d64), "S^T B": (y64.T, d64), "X S": (d64.T, y64), "X S^T": (d64.T, y64.T)}[product]
    ref = ops[0] @ ops[1]  # the product times 2^-(es + eb), exact but for float64's rounding
    k = ops[0].shape[1]
    assert k == 4096 and k * np.abs(y64).max() * np.abs(d64).max() * 2.0 ** (es + eb) >= fi.tiny
    with np.errstate(under="ignore"):
        unchecked = bl.matmul(*args, memory="1MiB", check_finite=False, **kw).to_numpy()
    assert np.abs(unchecked).max() < fi.tiny
    # an entry's error bound, 2 terms summed: |c - fl(c)| <= gamma_2 |s|^T |b| (Higham 2002, eq. 3.5), doubled,
    # in the scaled units; underflow adds up to 2^(minexp - nmant - 1) per term, ~2^9 (float32: 2^11) times it
    bound = 2 * 2 * eps(dtype) * (np.abs(ops[0]) @ np.abs(ops[1]))
    assert (np.abs(np.ldexp(unchecked.astype(np.float64), -(es + eb)) - ref) > bound).any()  # what had come back
    with pytest.raises(ParameterError, match=rf"^a: must give a product within {fi.dtype.name}'s normal range .*"
                                             r"got a product whose entries are all below 2\^-\d+ \(c max \|s\| "
                                             r"max \|b\| below 2\^-\d+, c = 2 entries at most in a "
                                             rf"{'row' if product in ('S B', 'X S^T') else 'column'} of s "
                                             r"\(k = 4096\)\)") as err:
        bl.matmul(*args, tmp_path / "c.zarr", memory="1MiB", **kw)
    assert not (tmp_path / "c.zarr").exists() and not list(tmp_path.glob(".c.zarr*"))
    pa, pb, q = (int(g) for g in re.search(r"sparse matrix by 2\^(\d+) .*dense operand by 2\^(\d+) .*then "
                                           r"2\^(\d+) times", str(err.value)).groups())
    z = y.copy()
    z.data = np.ldexp(y.data, pa)
    zs, dz = bl.from_sparse(z, tmp_path / "z.zarr"), np.ldexp(dense, pb)
    got = bl.matmul(*({"S B": (zs, dz), "S^T B": (zs, dz), "X S": (dz.T, zs), "X S^T": (dz.T, zs)}[product]),
                    memory="1MiB", **kw).to_numpy()
    # the scaled product is 2^(q + es + eb) times ref, a power of two within range: the bounds hold
    assert np.all(np.abs(np.ldexp(got.astype(np.float64), -(q + es + eb)) - ref) <= bound)
    assert_product(np.ldexp(got.astype(np.float64), -(q + es + eb)), ref, *ops, dtype=dtype)


def test_a_sparse_product_that_merely_cancels_below_the_normal_numbers_is_kept(tmp_path):
    """Rows whose 2 normal terms cancel to 0 or to a subnormal: the bound ``c max|s| max|b|`` reaches the
    normal numbers, so the product is kept, exact here (a difference of two normal numbers within a factor 2
    of each other is exact, Sterbenz)."""
    fi = np.finfo(np.float64)
    h = fi.minexp // 2 + 1
    y = scipy.sparse.csr_matrix(np.array([[2.0 ** h, -2.0 ** h, 0, 0], [0, 0, 2.0 ** h, -2.0 ** h]]))
    s = bl.from_sparse(y, tmp_path / "y.zarr")
    b = np.array([[2.0 ** h * (1 + fi.eps)], [2.0 ** h], [2.0 ** h], [2.0 ** h]])
    got = bl.matmul(s, b, tmp_path / "c.zarr", memory="1MiB").to_numpy()
    assert np.array_equal(got, np.array([[np.ldexp(1.0, 2 * h - fi.nmant)], [0.0]]))


def test_a_sparse_gram_whose_sums_overflow_is_refused(tmp_path):
    """Entries below ``2^512`` whose squares sum past float64's range (34 of ``1.5 * 2^511`` in a column)
    had returned a Gram holding Inf without an error: the refusal had judged the range by
    ``2 log2(max |a|)`` alone, which stays in range (found by a randomized search, 2026-12-06). Refused now
    with the scaling that fits, which gives the exact ``4^k`` times scaled Gram."""
    x = scipy.sparse.random(34, 20, density=0.2, random_state=1, format="lil")
    x[:, 3] = 1.5 * 2.0 ** 511
    x = x.tocsr()
    with pytest.raises(ParameterError, match=r"^a: must have a Gram matrix within the range of float64") as err:
        bl.gram(bl.from_sparse(x, tmp_path / "x.zarr"), tmp_path / "g.zarr", memory="2MiB")
    assert not (tmp_path / "g.zarr").exists()
    k = int(str(err.value).split("times 2.0**")[1].split(" ")[0])
    z = x.copy()
    z.data = np.ldexp(z.data, k)
    g = bl.gram(bl.from_sparse(z, tmp_path / "z.zarr"), memory="2MiB").to_numpy()
    assert np.isfinite(g).all()
    assert_gram(g, (z.T @ z).toarray(), z.toarray())


def test_a_sparse_gram_whose_sums_overflow_to_nan_is_refused(tmp_path):
    """Entries near ``2^531`` of both signs: their products overflow to ``+Inf`` and ``-Inf``, whose sum in an
    off-diagonal entry is NaN. The range check had passed a NaN over as data read unchecked, and the Gram
    came back holding NaN and Inf without an error, though every entry was checked finite as read. Refused
    now as the Inf alone is."""
    x = scipy.sparse.csr_matrix(np.ldexp(np.array([[1.0, 1.0], [1.0, -1.0], [-1.0, 1.0]]), 531))
    with pytest.raises(ParameterError, match=r"^a: must have a Gram matrix within the range of float64"):
        bl.gram(bl.from_sparse(x, tmp_path / "x.zarr"), tmp_path / "g.zarr", memory="2MiB")
    assert not (tmp_path / "g.zarr").exists()


@pytest.mark.parametrize("k,dtype", [(-1060, np.float64), (-130, np.float32)])
def test_the_scaling_a_sparse_gram_refusal_names_can_be_applied(tmp_path, k, dtype):
    """Subnormal float64 entries and float32 ones near ``1e-39`` need a scaling beyond float64's range
    (``2^1284``) or float32's (``2^153``): the fix had said ``x * 2.0**k``, which raises OverflowError or (cast
    to float32) gives Inf entries (found by a randomized search, 2026-12-06). It names ``numpy.ldexp`` of the
    entries now, which scales exactly, and the scaled Gram is then ``4^k`` times the exact one."""
    x = scipy.sparse.random(60, 12, density=0.3, random_state=2, format="csr")
    x.data = np.ldexp(x.data, k).astype(dtype)
    with pytest.raises(ParameterError, match=r"^a: must have a Gram matrix within the range of") as err:
        bl.gram(bl.from_sparse(x, tmp_path / "x.zarr"), memory="2MiB")
    j = int(str(err.value).split("numpy.ldexp(x.data, ")[1].split(")")[0])
    z = x.copy()
    z.data = np.ldexp(z.data, j)
    g = bl.gram(bl.from_sparse(z, tmp_path / "z.zarr"), memory="2MiB").to_numpy()
    assert np.isfinite(g).all() and np.abs(g).max() > 0
    zd = z.toarray().astype(np.float64)
    assert_gram(g, zd.T @ zd, zd, dtype=dtype)


@pytest.mark.parametrize("product", ["S B", "S^T B", "X S"])
@pytest.mark.parametrize("s_power, d_power", [(60, -160), (-160, 60)])
def test_float32_result_of_float64_operands_beyond_float32s_range(rng, tmp_path, product, s_power, d_power):
    """``dtype='float32'`` of float64 operands, one near ``2^60`` and the other near ``2^-160`` (below
    float32's smallest subnormal ``2^-149``), whose product near ``2^-100`` lies well within float32's range:
    each operand had been cast to float32 before the float64 sum, the small one flushed to zero, and the
    product returned as zeros without an error (found by a randomized search, 2026-12-07). Only the sum is
    rounded to float32 now: ``|fl32(s) - SB| <= u_32 |SB| + gamma_k(u_64) |S||B|`` entry-wise (the float64
    sum, Higham 2002 eq. 3.5, then one rounding), so ``||err||_F <= 2^-24 ||SB||_F + 2 k 2^-53 ||S||_F ||B||_F``."""
    sp = _sparse(40, 30, 3, density=0.3)
    sp.data = np.ldexp(sp.data + 0.5, s_power)
    s = bl.from_sparse(sp, tmp_path / "s.zarr")
    sd = sp.toarray()
    if product == "S B":
        d = np.ldexp(rng.standard_normal((30, 3)), d_power)
        got, ref = bl.matmul(s, d, tmp_path / "c.zarr", dtype="float32"), sd @ d
        a, b = sd, d
    elif product == "S^T B":
        d = np.ldexp(rng.standard_normal((40, 3)), d_power)
        got, ref = bl.matmul(s, d, tmp_path / "c.zarr", trans_a=True, dtype="float32"), sd.T @ d
        a, b = sd.T, d
    else:
        d = np.ldexp(rng.standard_normal((3, 40)), d_power)
        got, ref = bl.matmul(d, s, tmp_path / "c.zarr", dtype="float32"), d @ sd
        a, b = d, sd
    c = got.to_numpy()
    assert c.dtype == np.float32 and np.linalg.norm(ref) > 2.0 ** -110
    k = a.shape[1]
    bound = 2.0 ** -24 * np.linalg.norm(ref) + 2 * k * 2.0 ** -53 * np.linalg.norm(a) * np.linalg.norm(b)
    assert np.linalg.norm(c.astype(np.float64) - ref) <= bound
