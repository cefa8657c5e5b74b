"""``blocklin.norm``, ``cond``, ``det``, ``slogdet`` against ``numpy.linalg``, and NumPy's dispatch
protocols on ``Matrix`` (NEP 18): NumPy-written code computes out of core on stored matrices.

Bounds, per quantity (``u = eps / 2``; Higham, *Accuracy and Stability*, 2nd ed.):

- sums of ``|a|`` (norms 1, inf) and of squares (Frobenius, LAPACK's scaled ``xLASSQ``): each a sum
  of ``t`` non-negative terms, relative error at most ``gamma_t`` for any order (Thm 3.5 / 4.3); two
  computations: ``2 t eps``;
- singular values (2, -2, nuc, cond): a backward-stable SVD moves each by ``c M eps s_1`` (Weyl), the
  2-norm by block Lanczos to a residual ``r = 10 sqrt(eps) s_1`` is within ``r^2 / gap`` more (Kato-Temple);
- ``log |det A|``: LU's backward error ``|dA| <= gamma_n |L| |U|`` (Thm 9.3) moves it by
  ``tr(A^-1 dA) <= n ||A^-1||_2 ||dA||_2`` to first order.
"""

from __future__ import annotations

import math
import os
import warnings

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import ParameterError, ShapeError
from support.tolerances import eps

BUDGETS = {"streamed": "1MiB", "in-memory": "256MiB"}


def spectrum(m: int, n: int, s: np.ndarray, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((m, len(s))))
    v, _ = np.linalg.qr(rng.standard_normal((n, len(s))))
    return (u * s) @ v.T


@pytest.mark.parametrize("budget", list(BUDGETS))
@pytest.mark.parametrize("scale", [1.0, 2.0 ** 600, 2.0 ** -600], ids=["unit", "huge", "tiny"])
def test_entrywise_norms(scale, budget):
    """Frobenius without overflow or underflow at 2^±600 (its squares leave float64), 1, inf, -1, -inf."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3000, 40))
    ref = {o: np.linalg.norm(a, o) for o in (None, "fro", 1, -1, np.inf, -np.inf)}
    x = a * scale
    for o, r in ref.items():
        got = bl.norm(x, o, memory=BUDGETS[budget]) / scale
        t = a.size if o in (None, "fro") else max(a.shape)
        assert abs(got - r) <= 2 * t * eps(np.float64) * r, (o, got, r)


@pytest.mark.parametrize("budget", list(BUDGETS))
def test_spectral_norms(budget):
    s = np.concatenate([[10.0, 5.0], np.linspace(2.0, 0.01, 28)])  # s_1 well apart: gap 75 in s^2
    a = spectrum(3000, 30, s, seed=2)
    M, s1 = 3000, s[0]
    r = 10 * math.sqrt(eps(np.float64)) * s1
    assert abs(bl.norm(a, 2, memory=BUDGETS[budget]) - s1) <= r ** 2 / (s1 ** 2 - s[1] ** 2) * s1 + 4 * M * eps(
        np.float64) * s1
    assert abs(bl.norm(a, -2, memory=BUDGETS[budget]) - s[-1]) <= 4 * M * eps(np.float64) * s1
    assert abs(bl.norm(a, "nuc", memory=BUDGETS[budget]) - s.sum()) <= 30 * 4 * M * eps(np.float64) * s1
    kappa = s1 / s[-1]
    assert abs(bl.cond(a, memory=BUDGETS[budget]) - kappa) <= 4 * M * eps(np.float64) * (1 + kappa) * kappa


@pytest.mark.parametrize("budget", list(BUDGETS))
@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
def test_spectral_norm_of_single_precision_data(dtype, budget):
    """Its Lanczos residual is asked to ``100 eps`` of the data's dtype, which its rounded products can
    reach: ``10 sqrt(eps)`` of float64 warned on every float32 norm (found by a randomized search). The
    value: Weyl for the data's own rounding in the products, ``4 M eps_32 s_1``, and Kato-Temple for the
    residual, ``r^2 / gap``."""
    import warnings

    s = np.concatenate([[10.0, 5.0], np.linspace(2.0, 0.01, 28)])
    a = spectrum(3000, 30, s, seed=2)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * spectrum(3000, 30, s, seed=3)
    a = a.astype(dtype)
    sv = np.linalg.svd(a.astype(np.complex128), compute_uv=False)
    ref = sv[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = bl.norm(a, 2, memory=BUDGETS[budget])
    r = 100 * eps(dtype) * ref
    assert abs(got - ref) <= r ** 2 / (ref ** 2 - sv[1] ** 2) * ref + 4 * 3000 * eps(dtype) * ref


@pytest.mark.parametrize("budget", list(BUDGETS))
def test_cond_of_complex_data(budget):
    """``cond`` of complex data: ``s_1 / s_N`` from the complex SVD (tall, and square), and the 1-norm
    condition from the complex inverse, against NumPy's. Bounds as for real data times ``3 sqrt(2)``
    (a complex product's rounding, Higham Lemma 3.5)."""
    rng = np.random.default_rng(7)
    c = 3 * math.sqrt(2)
    s = np.linspace(4.0, 0.05, 30)
    u, _ = np.linalg.qr(rng.standard_normal((600, 30)) + 1j * rng.standard_normal((600, 30)))
    v, _ = np.linalg.qr(rng.standard_normal((30, 30)) + 1j * rng.standard_normal((30, 30)))
    a = (u * s) @ v.conj().T
    kappa = s[0] / s[-1]
    assert abs(bl.cond(a, memory=BUDGETS[budget]) - kappa) <= c * 4 * 600 * eps(np.float64) * (1 + kappa) * kappa
    assert abs(bl.cond(a, -2, memory=BUDGETS[budget]) - 1 / kappa) <= c * 4 * 600 * eps(np.float64) * (1 + kappa)
    sq = rng.standard_normal((60, 60)) + 1j * rng.standard_normal((60, 60)) + 10 * np.eye(60)
    k2 = np.linalg.cond(sq)
    assert abs(bl.cond(sq, memory="4MiB") - k2) <= c * 4 * 60 * eps(np.float64) * (1 + k2) * k2  # the whole space
    for p in (1, np.inf):  # the inverse's forward error is cond_2 times its backward error (Higham Thm 14.2)
        ref = np.linalg.cond(sq, p)
        assert abs(bl.cond(sq, p, memory=BUDGETS[budget]) - ref) <= c * 16 * 60 * eps(np.float64) * k2 * ref, p


def test_determinants_and_cond_of_a_square_matrix():
    rng = np.random.default_rng(3)
    n = 200
    a = rng.standard_normal((n, n)) + 20 * np.eye(n)  # log|det| about 600: det overflows nowhere, slogdet is exact
    sign, logdet = bl.slogdet(a, memory="256KiB")
    ref = np.linalg.slogdet(a)
    bound = n * np.linalg.norm(np.linalg.inv(a), 2) * 2 * n * eps(np.float64) * np.linalg.norm(a) * 2
    assert sign == ref.sign and abs(logdet - ref.logabsdet) <= bound
    small = a[:20, :20] / 20
    assert abs(bl.det(small) - np.linalg.det(small)) <= 20 * 20 * eps(np.float64) * np.linalg.norm(
        np.linalg.inv(small), 2) * np.linalg.norm(small) * 4 * abs(np.linalg.det(small))
    singular = a.copy()
    singular[:, 3] = 0.0
    assert bl.slogdet(singular) == (0.0, -math.inf) and bl.det(singular) == 0.0
    k1 = np.linalg.cond(a, 1)
    assert abs(bl.cond(a, 1, memory="256KiB") - k1) <= 16 * n * eps(np.float64) * np.linalg.cond(a) * k1


def test_bad_arguments():
    a = np.eye(4)
    with pytest.raises(ParameterError, match="ord: must be one of None, 'fro', 'nuc'.*got 3"):
        bl.norm(a, 3)
    with pytest.raises(ParameterError, match="ord"):
        bl.norm(a, True)
    with pytest.raises(ShapeError, match="a: must be square for cond"):
        bl.cond(np.ones((4, 3)), 1)


@pytest.mark.parametrize("p", [1, -1, np.inf, -np.inf, "fro"])
def test_cond_of_a_singular_matrix_is_inf_as_numpy(p):
    """NumPy turns the NaN of a failed inversion into ``inf``; ``cond(p)`` through ``inv`` had raised
    ``SingularMatrixError`` (an exactly singular ``A``: a zero column, rank 5 of 6). ``p=None`` was
    ``inf`` already."""
    a = np.random.default_rng(7).standard_normal((6, 6))
    a[:, 2] = 0.0
    assert np.linalg.cond(a, p) == np.inf
    assert bl.cond(a, p) == math.inf and bl.cond(a) == math.inf


def test_cond_of_a_numerically_singular_matrix_stays_refused():
    """Singular values 1 ... 1e-18 with no exact zero pivot: NumPy's ``cond(a, 1)`` is a finite number of
    rounding-level accuracy, never ``inf``; ``inv``'s refusal stands (``inf`` is for exact zero pivots)."""
    rng = np.random.default_rng(8)
    u, v = np.linalg.qr(rng.standard_normal((40, 40)))[0], np.linalg.qr(rng.standard_normal((40, 40)))[0]
    a = (u * np.logspace(0, -18, 40)) @ v.T
    assert np.isfinite(np.linalg.cond(a, 1))
    with pytest.raises(bl.errors.SingularMatrixError, match="numerically singular"):
        bl.cond(a, 1)


# -- NEP 18 -------------------------------------------------------------------------------------------
@pytest.fixture
def stored(tmp_path):
    rng = np.random.default_rng(4)
    a = rng.standard_normal((120, 120))
    a = a @ a.T + 120 * np.eye(120)
    b = rng.standard_normal((120, 7))
    return a, b, bl.from_array(a, str(tmp_path / "a.zarr")), bl.from_array(b, str(tmp_path / "b.zarr"))


def test_numpy_products_run_out_of_core(stored):
    a, b, A, B = stored
    for c in (A @ B, np.matmul(A, B), np.dot(A, B), a @ B):
        assert isinstance(c, bl.Matrix) and "flops" in c.report  # computed by blocklin, stored
        # a product: k = 120 terms, norm-wise (support.tolerances.product_bound)
        assert np.linalg.norm(c.to_numpy() - a @ b) <= 2 * 120 * eps(np.float64) * np.linalg.norm(a) * np.linalg.norm(b)
    v = np.matmul(A, np.ones(120))
    assert isinstance(v, np.ndarray) and v.shape == (120,)
    w = np.ones(120) @ A
    assert w.shape == (120,) and np.allclose(w, a.sum(axis=0), rtol=0, atol=240 * eps(np.float64) * np.abs(a).sum(0).max())


def test_numpy_linalg_runs_out_of_core(stored):
    a, b, A, B = stored
    inv = np.linalg.inv(A)
    assert isinstance(inv, bl.Matrix) and "backward_error" in inv.report  # blocklin.inv, refined
    kappa = np.linalg.cond(a)
    assert np.linalg.norm(a @ inv.to_numpy() - np.eye(120)) <= 8 * 120 * eps(np.float64) * kappa * 120
    L = np.linalg.cholesky(A)
    assert isinstance(L, bl.Matrix) and np.linalg.norm(L.to_numpy() @ L.to_numpy().T - a) <= 4 * 120 * eps(
        np.float64) * np.linalg.norm(a)
    x = np.linalg.solve(A, np.ones(120))
    assert isinstance(x, np.ndarray) and x.shape == (120,)
    assert np.linalg.norm(a @ x - 1) <= 8 * 120 * eps(np.float64) * np.linalg.norm(a) * np.linalg.norm(x)
    U, s, Vt = np.linalg.svd(B, full_matrices=False)
    assert isinstance(U, bl.Matrix) and U.shape == (120, 7)
    assert np.abs(s - np.linalg.svd(b, compute_uv=False)).max() <= 4 * 120 * eps(np.float64) * s[0]
    assert np.linalg.svd(B, compute_uv=False).shape == (7,)
    Q, R = np.linalg.qr(B)
    assert isinstance(Q, bl.Matrix) and isinstance(R, bl.Matrix) and Q.shape == (120, 7)
    assert np.linalg.norm(Q.to_numpy() @ R.to_numpy() - b) <= 4 * 120 * eps(np.float64) * np.linalg.norm(b)
    assert abs(np.linalg.norm(A) - np.linalg.norm(a)) <= 2 * a.size * eps(np.float64) * np.linalg.norm(a)
    sign, logdet = np.linalg.slogdet(A)
    # LU's backward error through tr(A^-1 dA) (module docstring), two computations
    bound = 120 * np.linalg.norm(np.linalg.inv(a), 2) * 2 * 120 * eps(np.float64) * np.linalg.norm(a) * 2
    assert sign == 1.0 and abs(logdet - np.linalg.slogdet(a).logabsdet) <= bound
    x, res, rank, sv = np.linalg.lstsq(B, np.ones(120), rcond=None)
    assert rank == 7 and x.shape == (7,)


@pytest.mark.parametrize("kind", ["real", "complex", "empty"])
def test_numpy_lstsq_rank_has_numpys_type(tmp_path, kind):
    """``np.linalg.lstsq(M, b)`` of a stored ``Matrix`` (and ``blocklin.lstsq``) returned ``rank`` as a Python
    ``int`` where NumPy's is its own integer type (``numpy.int32`` here): the same type as NumPy's now, for real,
    complex and empty ``A`` (each route builds the result)."""
    rng = np.random.default_rng(3)
    a = {"real": lambda: rng.standard_normal((9, 4)), "complex": lambda: rng.standard_normal((9, 4)) + 1j,
         "empty": lambda: np.zeros((9, 0))}[kind]()
    b = rng.standard_normal(9)
    want = np.linalg.lstsq(a, b, rcond=None)[2]
    got = np.linalg.lstsq(bl.from_array(a, tmp_path / "a.zarr"), b, rcond=None)[2]
    assert type(got) is type(want) and got == want
    assert type(bl.lstsq(a, b)[2]) is type(want)


def test_full_matrices_of_a_rectangle_is_refused_with_the_fix(stored):
    _, _, _, B = stored
    with pytest.raises(ParameterError, match="full_matrices: must be False.*Fix: pass full_matrices=False"):
        np.linalg.svd(B)


def test_numpy_2_named_results(stored):
    """NumPy 2 returns ``svd``, ``qr`` and ``slogdet`` as named tuples; code reading ``.S``, ``.Vh``, ``.Q``,
    ``.R``, ``.sign`` or ``.logabsdet`` had raised ``AttributeError`` on a ``Matrix`` (plain tuples). Same
    values as the unpacked results; ``svd``'s keeps blocklin's ``report``."""
    a, b, A, B = stored
    r = np.linalg.svd(B, full_matrices=False)
    assert type(r).__mro__[1] is type(np.linalg.svd(b, full_matrices=False)) and "passes" in r.report
    assert r.U is r[0] and r.S is r[1] and r.Vh is r[2] and isinstance(r.U, bl.Matrix)
    q = np.linalg.qr(B)
    assert q.Q is q[0] and q.R is q[1] and isinstance(q.Q, bl.Matrix)
    d = np.linalg.slogdet(A)
    assert (d.sign, d.logabsdet) == tuple(d) and type(d.logabsdet) is np.float64
    assert d._fields == np.linalg.slogdet(a)._fields


def test_complex_times_real_refusal_names_the_complex_cast(tmp_path):
    """``blocklin.matmul`` of a complex128 ``Matrix`` and a float64 ``b`` is refused (operands share one
    dtype); the fix had said ``dtype='float64'``, which would drop the imaginary parts: it names NumPy's
    promotion, ``complex128``, with which the product is NumPy's. ``M @ b`` takes that promotion itself
    (NumPy code has no ``dtype=`` to pass: test_products_of_two_dtypes_promote_as_numpy)."""
    rng = np.random.default_rng(9)
    a = rng.standard_normal((5, 4)) + 1j * rng.standard_normal((5, 4))
    b = rng.standard_normal((4, 3))
    A = bl.from_array(a, str(tmp_path / "c.zarr"))
    with pytest.raises(bl.errors.DTypeError, match=r"Fix: pass dtype='complex128' to cast while streaming"):
        bl.matmul(A, b)
    for c in (bl.matmul(A, b, dtype="complex128").to_numpy(), (A @ b).to_numpy()):
        assert c.dtype == np.complex128
        assert np.linalg.norm(c - a @ b) <= 2 * 4 * eps(np.float64) * np.linalg.norm(a) * np.linalg.norm(b)  # product_bound


def test_dot_with_a_scalar_as_numpy(tmp_path):
    """``np.dot(M, 2.0)`` is NumPy's ``np.dot`` on the loaded matrix, with its result dtype: a Python float
    makes float32 data's product float64 (it had been ``np.multiply``'s float32)."""
    a = np.random.default_rng(5).standard_normal((5, 4)).astype(np.float32)
    A = bl.from_array(a, str(tmp_path / "a32.zarr"))
    for got, ref in ((np.dot(A, 2.0), np.dot(a, 2.0)), (np.dot(2.0, A), np.dot(2.0, a)),
                     (np.dot(A, np.float32(2)), np.dot(a, np.float32(2)))):
        assert got.dtype == ref.dtype and np.array_equal(got, ref)  # one rounding of the same products


def test_other_numpy_functions_load_the_matrix(stored):
    a, _, A, _ = stored
    assert np.sum(A) == np.sum(a)
    assert np.concatenate([A, A]).shape == (240, 120)
    assert np.array_equal(np.add(A, 1.0), a + 1.0)
    assert np.array_equal(np.asarray(A), a)
    assert np.allclose(np.linalg.norm(A, axis=0), np.linalg.norm(a, axis=0), rtol=240 * eps(np.float64), atol=0)


@pytest.mark.parametrize("dtype", [np.float32, np.complex64, np.float64, np.complex128])
def test_numpy_linalg_scalars_carry_numpys_result_dtype(dtype, tmp_path):
    """``np.linalg.norm``, ``cond``, ``det`` and ``slogdet`` of a stored float32 (complex64) matrix return
    NumPy's scalar types for the same ndarray, ``numpy.float32`` (``numpy.complex64`` for a complex
    ``det`` and ``sign``), not float64; computed in float64 and cast, each within the float32 rounding of
    the cast (``u``) beside NumPy's own float32 computation (``2 n eps`` for the sums of a norm; through
    ``kappa`` for the LU's ``log |det|`` and the inverse's 1-norm condition, module docstring)."""
    rng = np.random.default_rng(8)
    n = 40
    a = 0.1 * rng.standard_normal((n, n)) + 2 * np.eye(n)  # det near 2^40: within float32's range
    if np.dtype(dtype).kind == "c":
        a = a + 0.1j * rng.standard_normal((n, n))
    a = a.astype(dtype)
    A = bl.from_array(a, tmp_path / "a.zarr")
    e, kappa = eps(dtype), np.linalg.cond(a.astype(np.complex128))
    calls = {"norm": lambda m: np.linalg.norm(m), "norm 1": lambda m: np.linalg.norm(m, 1),
             "norm inf": lambda m: np.linalg.norm(m, np.inf), "norm 2": lambda m: np.linalg.norm(m, 2),
             "cond": lambda m: np.linalg.cond(m), "cond 1": lambda m: np.linalg.cond(m, 1),
             "det": lambda m: np.linalg.det(m), "sign": lambda m: np.linalg.slogdet(m)[0],
             "logabsdet": lambda m: np.linalg.slogdet(m)[1]}
    for what, call in calls.items():
        got, ref = call(A), call(a)
        assert type(got) is type(ref), (what, type(got), type(ref))
        bound = {"norm": 2 * n * e, "norm 1": 2 * n * e, "norm inf": 2 * n * e, "norm 2": 4 * n * e,
                 "cond": 8 * n * e * kappa, "cond 1": 32 * n * e * kappa, "det": 8 * n * n * e * kappa,
                 "sign": 8 * n * n * e * kappa, "logabsdet": 8 * n * n * e * kappa}[what]
        assert abs(complex(got) - complex(ref)) <= bound * abs(complex(ref)), (what, got, ref)


def test_numpy_linalg_scalars_beyond_float32s_range_are_inf_as_numpys(tmp_path):
    """Cast from float64, a norm past float32's largest is ``inf``, as NumPy's float32 norm of the same
    data; below it the exact value, where NumPy's float32 sum of squares has already overflowed."""
    for e, fro in ((125, np.float32(np.inf)), (100, np.float32(16 * 2.0 ** 100))):
        a = np.full((16, 16), 2.0 ** e, dtype=np.float32)
        A = bl.from_array(a, tmp_path / f"a{e}.zarr")
        got = np.linalg.norm(A)
        assert type(got) is np.float32 and got == fro
        with np.errstate(over="ignore"):
            assert np.linalg.norm(a) == np.inf  # NumPy's own: float32 squares
        got1 = np.linalg.norm(A, 1)  # (the cast to inf warns nowhere)
        with np.errstate(over="ignore"):
            assert got1 == np.linalg.norm(a, 1) and type(got1) is np.float32
        assert bl.norm(A) == 16 * 2.0 ** e and type(bl.norm(A)) is float  # blocklin's own: float64 values


@pytest.mark.parametrize("dtype,scale", [(np.float64, 1.0), (np.float64, 2.0**665), (np.complex128, 1.0),
                                         (np.float32, 1.0)])
def test_norms_of_a_stored_sparse_matrix_as_scipys(tmp_path, dtype, scale):
    """``numpy.linalg.norm(SparseMatrix)`` had raised a TypeError (and ``blocklin.norm`` refused it): the
    orders SciPy's ``scipy.sparse.linalg.norm`` computes now come from the stored row blocks (empty rows
    and a whole empty block among them; entries near 2^665 whose squares overflow: SciPy's Frobenius norm
    is inf there, the reference is its norm of the data scaled by 2^-665, exactly), ``2`` from the
    largest singular value (of real data: the sparse SVD refuses complex data by name); ``-2``, ``'nuc'``
    and an ``axis`` are refused by name, as SciPy refuses the first two. Bounds: sums of ``t <= nnz`` terms,
    ``2 t eps`` relative (module notes); the 2-norm within ``100 eps`` of float64 (Lanczos residual
    ``10 sqrt(eps)``, squared over the gap)."""
    import scipy.sparse
    import scipy.sparse.linalg

    from blocklin.storage.sparse import SparseWriter

    m, n = 120, 40
    x = scipy.sparse.random(m, n, density=0.1, random_state=6, format="lil", dtype=np.float64)
    if dtype == np.complex128:
        x = x + 1j * scipy.sparse.random(m, n, density=0.1, random_state=7, format="lil")
    x = x.tolil()
    x[30:70] = 0  # rows 32:64 are a whole empty block
    x[5] = 0
    x[-1] = 0
    x = (x.tocsr() * scale).astype(dtype)
    x.eliminate_zeros()
    w = SparseWriter(tmp_path / "s.zarr", (m, n), dtype, entry_chunk=64, row_chunk=64)
    for r0 in range(0, m, 32):  # row blocks of 32 rows
        blk = x[r0:r0 + 32]
        w.write_rows(r0, r0 + blk.shape[0], blk.indptr.astype(np.int64), blk.indices, blk.data)
    w.commit()
    s = bl.open(tmp_path / "s.zarr")
    assert s.n_blocks == 4
    t = 2 * x.nnz * float(np.finfo(dtype).eps)
    for ord in (None, "fro", 1, -1, np.inf, -np.inf):
        want = scipy.sparse.linalg.norm(x.astype(np.complex128 if dtype == np.complex128 else np.float64) / scale,
                                        ord) * scale
        got = np.linalg.norm(s, ord)
        assert got == pytest.approx(want, rel=t, abs=0), ord
        assert bl.norm(tmp_path / "s.zarr", ord) == got  # a path too
    if dtype == np.complex128:  # the sparse SVD computes with real row blocks: refused by name
        from blocklin.errors import DTypeError

        with pytest.raises(DTypeError, match=r"^a: must be a real sparse matrix"):
            np.linalg.norm(s, 2)
    elif scale == 1.0:
        two = np.linalg.norm(x.toarray().astype(np.complex128 if dtype == np.complex128 else np.float64), 2)
        assert np.linalg.norm(s, 2) == pytest.approx(two, rel=100 * eps(np.float64) + 100 * eps(dtype))
    for ord in (-2, "nuc"):
        with pytest.raises(ParameterError, match=r"^ord: must be None, 'fro', 1, -1, 2, inf or -inf for a stored "
                                                 r"sparse matrix.*Fix: convert it to a dense array"):
            np.linalg.norm(s, ord)
    with pytest.raises(ParameterError, match=r"^axis: must be None"):
        np.linalg.norm(s, axis=0)
    assert np.shape(s) == (m, n)  # other NumPy functions as before


def test_norm_of_a_vector_is_numpys_or_refused(tmp_path):
    """A 1-D ``a`` is an ``n x 1`` column; its matrix norms ``None``, ``1``, ``2``, ``inf``, ``-inf`` are NumPy's
    vector norms, but ``norm(x, -1)`` had returned ``sum |x|`` (9.5) for NumPy's ``1 / sum(1 / |x|)`` (0.32) and
    ``-2`` the 2-norm, silently: those, and ``'fro'``/``'nuc'`` that NumPy refuses for a vector, are refused
    for a NumPy, Dask or stored 1-D array, naming the column's reshape. Bound: sums of 4 terms, ``8 eps``."""
    import dask.array as da
    import zarr

    x = np.array([3.0, -4.0, 0.5, 2.0])
    z = zarr.create_array(store=str(tmp_path / "v.zarr"), shape=(4,), dtype="f8", chunks=(2,))
    z[...] = x
    for a in (x, da.from_array(x, chunks=2), tmp_path / "v.zarr"):
        for ord in (None, 1, 2, np.inf, -np.inf):
            assert bl.norm(a, ord) == pytest.approx(np.linalg.norm(x, ord), rel=8 * eps(np.float64))
        for ord in (-1, -2, "fro", "nuc"):
            with pytest.raises(ParameterError, match=rf"^ord: must be None, 1, 2, inf or -inf for a 1-D a.*got "
                                                     rf"ord={ord!r} of a vector of 4 entries\. Fix: .*reshape\(-1, 1\)"):
                bl.norm(a, ord)
    for ord in (-1, -2, "fro", "nuc"):  # the column's matrix norms, as NumPy's of the column
        assert bl.norm(x.reshape(-1, 1), ord) == pytest.approx(np.linalg.norm(x.reshape(-1, 1), ord),
                                                               rel=8 * eps(np.float64))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_numpy_products_and_functions_of_a_stored_sparse_matrix(tmp_path, dtype):
    """NumPy had taken a ``SparseMatrix`` for a 0-d object array: ``S @ B``, ``B @ S``, ``np.matmul`` and
    ``np.dot`` raised a gufunc's "does not have enough dimensions", ``np.linalg.solve`` "0-dimensional array
    given", and ``np.sum(S)`` returned the handle itself (found by a randomized search). The products now run
    ``blocklin.matmul`` on the sparse operand (a stored ``Matrix``; a vector operand gives a vector), other
    functions NumPy's own on the dense matrix. Bound: a product of inner dimension ``t``, ``2 t eps``
    relative entry by entry on ``|S| |B|`` (module notes), in the operands' dtype."""
    import scipy.sparse

    m, n = 30, 20
    x = scipy.sparse.random(m, n, density=0.2, random_state=3, format="lil", dtype=np.float64).astype(dtype)
    x[4] = 0  # an empty row
    x = x.tocsr()
    x.eliminate_zeros()
    s = bl.from_sparse(x, tmp_path / "s.zarr")
    d = x.toarray().astype(np.float64)
    rng = np.random.default_rng(0)
    b, c, v = (rng.standard_normal(shape).astype(dtype) for shape in ((n, 3), (2, m), (n,)))

    def close(got, want, left, right):
        bound = 2 * left.shape[-1] * eps(dtype) * (np.abs(left) @ np.abs(right))
        assert got.shape == want.shape and np.all(np.abs(got - want) <= bound)

    for got in (s @ b, np.matmul(s, b), np.dot(s, b)):
        assert isinstance(got, bl.Matrix) and got.dtype == dtype
        close(got.to_numpy(), d @ b, d, b)
    got = c @ s
    assert isinstance(got, bl.Matrix)
    close(got.to_numpy(), c.astype(np.float64) @ d, c.astype(np.float64), d)
    got = s @ v
    assert isinstance(got, np.ndarray) and got.ndim == 1
    close(got, d @ v, d, v)
    assert np.sum(s) == pytest.approx(d.sum(), rel=2 * x.nnz * eps(dtype))
    sol = np.linalg.lstsq(s, np.ones(m), rcond=None)[0]  # NumPy's own, on the dense matrix
    np.testing.assert_array_equal(sol, np.linalg.lstsq(x.toarray(), np.ones(m), rcond=None)[0])


@pytest.mark.parametrize("da,db", [(np.float64, np.float32), (np.float32, np.float64), (np.complex64, np.float64),
                                   (np.float64, np.complex128), (np.int64, np.float32)])
def test_products_of_two_dtypes_promote_as_numpy(tmp_path, da, db):
    """``M @ b`` with operands of two dtypes had been refused ("operands must share one dtype ... pass
    dtype='float64'"), a keyword the ``@`` of NumPy code cannot pass (found by a randomized search); the
    products now take NumPy's result dtype (an exact upcast), for a stored sparse operand too. Bound: a
    product of inner dimension ``t``, ``2 t eps`` of the result dtype on ``|A| |B|`` (module notes)."""
    import scipy.sparse

    rng = np.random.default_rng(5)
    a = (4 * rng.standard_normal((9, 6))).astype(da)
    b = (4 * rng.standard_normal((6, 3))).astype(db)
    m = bl.from_array(a, tmp_path / "m.zarr")
    want = a @ b
    exact = a.astype(np.complex128) @ b.astype(np.complex128)
    bound = 2 * 6 * eps(want.dtype) * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64))
    results = [m @ b, np.matmul(m, b), np.dot(m, b), b.T.copy() @ bl.from_array(a.T.copy(), tmp_path / "t.zarr")]
    if np.dtype(da).kind == "f" and np.dtype(db).kind == "f":  # (a complex dense operand: refused by name)
        results.append(bl.from_sparse(scipy.sparse.csr_matrix(a), tmp_path / "s.zarr") @ b)
    for i, got in enumerate(results):
        got = got.to_numpy() if isinstance(got, bl.Matrix) else np.asarray(got)
        got = got.T if i == 3 else got  # b^T A^T
        assert got.dtype == want.dtype and np.all(np.abs(got - exact) <= bound)
    v = m @ b[:, 0]
    assert v.dtype == want.dtype and v.shape == (9,) and np.all(np.abs(v - exact[:, 0]) <= bound[:, 0])


@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (0, 0)])
@pytest.mark.parametrize("ord", [None, "fro", "nuc", 1, -1, 2, -2, math.inf, -math.inf])
def test_norms_of_an_empty_matrix_are_numpys(tmp_path, shape, ord):
    """A matrix with no entries has NumPy's norms: ``0.0``, or a refusal naming ``ord`` where NumPy refuses a
    minimum over nothing (``-1`` with no columns, ``-inf`` with no rows, ``-2``). ``2`` and ``'nuc'`` had been
    refused as an SVD's ``k=0``, ``-inf`` of 3 rows with no columns had returned ``inf`` for NumPy's ``0.0`` and
    ``-1`` with none ``0.0`` (found by a randomized search, 2026-12-06); a stored sparse matrix answers alike."""
    x = np.zeros(shape)
    try:
        want = float(np.linalg.norm(x, ord))
    except ValueError:
        want = None
    operands = [x, bl.from_array(x, tmp_path / "x.zarr")]
    if ord not in ("nuc", -2):  # refused for every stored sparse matrix (SciPy's too)
        import scipy.sparse

        operands.append(bl.from_sparse(scipy.sparse.csr_matrix(shape), tmp_path / "s.zarr"))
    for a in operands:
        if want is None:
            with pytest.raises(ParameterError, match=r"^ord: must name a norm defined for an empty matrix"):
                bl.norm(a, ord, memory="1MiB")
        else:
            assert bl.norm(a, ord, memory="1MiB") == want


def test_equality_operators_compare_entries_as_numpy(tmp_path):
    """``M == x`` and ``M != x`` are NumPy's element-wise comparisons (of the loaded matrix): the default object
    identity had answered ``M == 0`` with ``False``, so ``np.count_nonzero(M == 0)`` counted 0 zeros of 3, and a
    copy in another store compared unequal, without a word; a stored sparse matrix's too (on its dense copy). The
    handles stay dictionary keys (by identity)."""
    a = np.array([[0.0, 1.0], [2.0, 0.0], [0.0, 3.0]])
    M, N = bl.from_array(a, tmp_path / "m.zarr"), bl.from_array(a, tmp_path / "n.zarr")
    assert np.count_nonzero(M == 0) == np.count_nonzero(a == 0) == 3
    for got, want in ((M == 0, a == 0), (0 == M, 0 == a), (M != 0, a != 0), (M == N, a == a), (M != N, a != a),
                      (M == a[:, :1], a == a[:, :1])):
        assert isinstance(got, np.ndarray) and got.dtype == bool and np.array_equal(got, want)
    assert {M: 1}[M] == 1 and hash(M) != hash(N)
    import scipy.sparse

    S = bl.from_sparse(scipy.sparse.csr_matrix(a), tmp_path / "s.zarr")  # a stored sparse matrix alike
    for got, want in ((S == 0, a == 0), (S != M, a != a), (a == S, a == a)):
        assert isinstance(got, np.ndarray) and got.dtype == bool and np.array_equal(got, want)
    assert {S: 1}[S] == 1


def test_asarray_without_a_copy_is_refused(tmp_path):
    """``np.asarray(M, copy=False)`` asks NumPy 2 for a view, never a copy; it had returned a new array read from
    the store, into which writes are lost. Refused with NumPy's ``ValueError``; ``copy=None`` and ``True`` load."""
    a = np.arange(6.0).reshape(3, 2)
    M = bl.from_array(a, tmp_path / "m.zarr")
    for call in (lambda: np.asarray(M, copy=False), lambda: np.array(M, copy=False)):
        with pytest.raises(ValueError, match=r"^copy: must not be False for a blocklin\.Matrix.*Fix: pass copy=None"):
            call()
    with pytest.raises(ValueError):
        np.asarray(a.astype(np.float32), dtype=np.float64, copy=False)  # NumPy's own rule
    for got in (np.asarray(M), np.array(M, copy=True), np.asarray(M, dtype=np.float32)):
        assert np.array_equal(got, a)


def test_numpy_solve_of_a_rectangle_is_refused_as_numpys(stored):
    """``np.linalg.solve`` of a non-square ``Matrix`` had returned ``blocklin.solve``'s least-squares solution where
    NumPy raises ``LinAlgError`` (of an inconsistent ``b``, an ``x`` with ``A x != b``, without a word): refused,
    naming ``lstsq``, a ``LinAlgError`` as NumPy's (and a ``ShapeError``). ``blocklin.solve`` itself keeps its least
    squares."""
    _, b, _, B = stored
    with pytest.raises(np.linalg.LinAlgError):
        np.linalg.solve(b, np.ones(120))
    with pytest.raises(np.linalg.LinAlgError, match=r"^a: must be square for numpy\.linalg\.solve.*got shape 120 x 7\. "
                                         r"Fix: call numpy\.linalg\.lstsq"):
        np.linalg.solve(B, np.ones(120))
    assert bl.solve(B, np.ones(120)).shape == (7, 1)


@pytest.mark.parametrize("ord", [None, "fro", 1, -1, math.inf, -math.inf])
def test_norm_of_half_precision_data_is_a_numpy_float16(tmp_path, ord):
    """``np.linalg.norm`` of float16 data is a ``numpy.float16`` in NumPy (its other functions refuse float16, as
    blocklin's); the stored matrix's had been a ``numpy.float32``. The value is the float64 norm of the data
    rounded once to float16 (relative error ``eps16 / 2``; ``eps16`` allowed); NumPy's, accumulated in float16 over
    at most 12 terms, is within ``12 eps16`` of it (Higham Thm 3.5, the bound of support.tolerances)."""
    rng = np.random.default_rng(3)
    a = rng.uniform(-4, 4, (12, 9)).astype(np.float16)
    M = bl.from_array(a, tmp_path / "h.zarr")
    got, ref, exact = np.linalg.norm(M, ord), np.linalg.norm(a, ord), np.linalg.norm(a.astype(np.float64), ord)
    assert type(got) is type(ref) is np.float16
    assert abs(float(got) - exact) <= eps(np.float16) * exact
    assert abs(float(got) - float(ref)) <= 12 * eps(np.float16) * exact


def test_inner_product_of_stored_vectors_is_numpys_scalar(tmp_path):
    """``v @ w`` and ``np.dot(v, w)`` of two vectors (a stored 1-D ``Matrix`` on either side) are NumPy's scalar
    inner product; they had been an array of shape ``(1,)`` (``np.stack([v @ v, 1.0])`` then fails, a 2-D
    result broadcasts). Bound: a product of ``n = 7`` terms, ``2 n eps ||v|| ||w||`` (support.tolerances)."""
    import zarr

    rng = np.random.default_rng(8)
    x, y = rng.standard_normal(7), rng.standard_normal(7)
    z = zarr.create_array(store=str(tmp_path / "v.zarr"), shape=(7,), dtype="f8", chunks=(3,))
    z[...] = x
    V = bl.Matrix(tmp_path / "v.zarr")
    for got, want in ((V @ V, x @ x), (np.dot(V, V), np.dot(x, x)), (y @ V, y @ x), (V @ y, x @ y),
                      (np.matmul(V, y), np.matmul(x, y))):
        assert type(got) is type(want) is np.float64
        assert abs(got - want) <= 2 * 7 * eps(np.float64) * np.linalg.norm(x) * max(np.linalg.norm(x), np.linalg.norm(y))


_WRITES = {
    "multiply(M, 2, out=M)": lambda M, x: np.multiply(M, 2, out=M),
    "add(x, x, out=M)": lambda M, x: np.add(x, x, out=M),
    "add(x, x, M) positional out": lambda M, x: np.add(x, x, M),
    "matmul(x, x, out=M)": lambda M, x: np.matmul(x, x, out=M),
    "sum(x, axis=0, out=M)": lambda M, x: np.sum(x, axis=0, out=M),
    "clip(x, 0, 1, out=M)": lambda M, x: np.clip(x, 0, 1, out=M),
    "add.at(M, ...)": lambda M, x: np.add.at(M, (0, 0), 5.0),
    "fill_diagonal(M, 0)": lambda M, x: np.fill_diagonal(M, 0.0),
    "copyto(M, x)": lambda M, x: np.copyto(M, x),
    "put(M, ...)": lambda M, x: np.put(M, [0], [100.0]),
    "putmask(M, ...)": lambda M, x: np.putmask(M, x > 4, 0.0),
    "place(M, ...)": lambda M, x: np.place(M, x > 4, [0.0]),
    "put_along_axis(M, ...)": lambda M, x: np.put_along_axis(M, np.zeros((3, 1), dtype=int), 7.0, axis=1),
}


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("call", list(_WRITES))
def test_numpy_writes_into_a_stored_matrix_are_refused(tmp_path, call, sparse):
    """NumPy calls that write in place (``out=M``, ``np.add.at``, ``np.fill_diagonal``, ``np.copyto``, ``np.put``...)
    had written into the copy loaded for them and returned, the store keeping its entries without a word
    (``np.fill_diagonal(M, 0)`` did nothing); a ufunc's ``out=M`` recursed without end. Refused naming the
    destination and the fix; the store is unchanged, and a stored matrix as a source still loads."""
    import scipy.sparse

    x = np.arange(9.0).reshape(3, 3)
    M = bl.from_sparse(scipy.sparse.csr_matrix(x), tmp_path / "s.zarr") if sparse else bl.from_array(x, tmp_path / "m.zarr")
    with pytest.raises(ParameterError, match=r"^(out|numpy\.[a-z_.]+'s first argument): must not be a stored matrix "
                                             r".*Fix: load it \(x = np\.asarray\(M\)\)"):
        _WRITES[call](M, x.copy())
    assert np.array_equal(M.toarray() if sparse else np.asarray(M), x)
    y = np.zeros((3, 3))
    np.copyto(y, M)
    assert np.array_equal(y, x)


@pytest.mark.parametrize("sparse", [False, True])
def test_truth_value_of_a_matrix_is_numpys(tmp_path, sparse):
    """``bool(M)`` (``if M:``) is NumPy's: the entry of a 1 x 1 matrix, refused for more entries (NumPy's
    ``ValueError``: ambiguous) and for none (NumPy 2's rule); it had been ``True`` whatever ``M`` held, a stored
    sparse matrix's too."""
    import scipy.sparse

    for x in (np.zeros((1, 1)), np.ones((1, 1)), np.zeros((2, 3)), np.eye(2), np.zeros((0, 3))):
        path = tmp_path / f"m{x.shape}{x.sum()}.zarr"
        M = bl.from_sparse(scipy.sparse.csr_matrix(x), path) if sparse else bl.from_array(x, path)
        try:
            want = bool(x)
        except ValueError:
            with pytest.raises(ValueError):
                bool(M)
        else:
            assert bool(M) is want


@pytest.mark.parametrize("call", ["svd", "svd_values", "qr", "inv", "slogdet", "norm", "solve", "matmul", "rmatmul"])
def test_stacked_matrices_are_refused_naming_the_shape(tmp_path, call):
    """A stored 3-D array (NumPy's stack of matrices, which its ``linalg`` functions and ``@`` batch) is refused by
    every protocol function naming its shape; ``np.linalg.svd`` had failed on an unpacking ``ValueError``
    ("too many values to unpack") instead."""
    import zarr

    z = zarr.create_array(store=str(tmp_path / "c.zarr"), shape=(2, 3, 3), dtype="f8", chunks=(1, 3, 3))
    z[...] = np.stack([np.eye(3) * 2.0] * 2)
    C = bl.Matrix(tmp_path / "c.zarr")
    calls = {"svd": lambda: np.linalg.svd(C), "svd_values": lambda: np.linalg.svd(C, compute_uv=False),
             "qr": lambda: np.linalg.qr(C), "inv": lambda: np.linalg.inv(C), "slogdet": lambda: np.linalg.slogdet(C),
             "norm": lambda: np.linalg.norm(C), "solve": lambda: np.linalg.solve(C, np.ones((2, 3))),
             "matmul": lambda: C @ np.ones((3, 2)), "rmatmul": lambda: np.ones((2, 3)) @ C}
    with pytest.raises(ShapeError, match=r"must be 2-D \(a matrix\); got shape \(2, 3, 3\)"):
        calls[call]()


@pytest.mark.parametrize("call", ["inv", "det", "slogdet", "cholesky", "cond1", "solve"])
def test_a_rectangle_where_numpy_wants_a_square_is_numpys_linalgerror(stored, call):
    """``numpy.linalg`` refuses a rectangle with ``LinAlgError``; a ``Matrix``'s refusal had been a ``ShapeError``
    (a ``ValueError``) only, which NumPy code's ``except np.linalg.LinAlgError`` missed. It is both now."""
    a, b, A, B = stored
    calls = {"inv": np.linalg.inv, "det": np.linalg.det, "slogdet": np.linalg.slogdet, "cholesky": np.linalg.cholesky,
             "cond1": lambda x: np.linalg.cond(x, 1), "solve": lambda x: np.linalg.solve(x, np.ones(120))}
    with pytest.raises(np.linalg.LinAlgError):
        calls[call](b)
    with pytest.raises(np.linalg.LinAlgError, match=r"^a: must be square") as info:
        calls[call](B)
    assert isinstance(info.value, ShapeError)


@pytest.mark.parametrize("sparse", [False, True])
def test_array_creation_like_a_stored_matrix_is_numpys(tmp_path, sparse):
    """``like=M`` (NEP 35: ``np.array(x, like=M)``, ``np.ones(3, like=M)``) makes NumPy's ndarray, as ``like=`` an
    ndarray does; it had raised ``AttributeError`` ('no attribute _implementation')."""
    import scipy.sparse

    x = np.eye(3)
    M = bl.from_sparse(scipy.sparse.csr_matrix(x), tmp_path / "s.zarr") if sparse else bl.from_array(x, tmp_path / "m.zarr")
    for got, want in ((np.array([1, 2], like=M), np.array([1, 2])), (np.ones(3, like=M), np.ones(3)),
                      (np.asarray([1.0], like=M), np.asarray([1.0])), (np.eye(2, like=M), np.eye(2)),
                      (np.arange(3, like=M), np.arange(3))):
        assert type(got) is np.ndarray and got.dtype == want.dtype and np.array_equal(got, want)


@pytest.mark.parametrize("da,db", [(np.float32, np.float64), (np.float64, np.float32), (np.float32, np.complex128),
                                   (np.complex64, np.float64)])
@pytest.mark.parametrize("stored_b", [False, True])
def test_numpy_solve_of_two_precisions_is_numpys(tmp_path, da, db, stored_b):
    """``np.linalg.solve(M, b)`` with operands of two precisions had been refused ("operands must share one
    dtype"), where NumPy casts both up and solves in the promoted dtype (``blocklin.solve`` itself keeps its
    documented refusal). The result has NumPy's dtype and its values: the forward error bound of a solve in
    that dtype, ``8 n eps kappa`` (support.tolerances.assert_solve), which a float32 solve would miss."""
    from support.tolerances import assert_solve

    rng = np.random.default_rng(6)
    n = 40
    a = (rng.standard_normal((n, n)) + n * np.eye(n)).astype(da)
    b = rng.standard_normal((n, 3)).astype(db)
    A = bl.from_array(a, tmp_path / "a.zarr")
    B = bl.from_array(b, tmp_path / "b.zarr") if stored_b else b
    want = np.linalg.solve(a, b)
    got = np.linalg.solve(A, B)
    got = got.to_numpy() if isinstance(got, bl.Matrix) else got
    assert got.dtype == want.dtype
    assert_solve(got, want, a.astype(want.dtype), dtype=want.dtype)
    v = np.linalg.solve(A, b[:, 0])
    assert v.dtype == want.dtype and v.shape == (n,)
    assert_solve(v, want[:, 0], a.astype(want.dtype), dtype=want.dtype)
    if np.dtype(db) == np.float64 and not stored_b:  # a list (float64 to NumPy) and a Dask array, cast as read
        import dask.array as dsk

        for bb in (b.tolist(), dsk.from_array(b, chunks=(20, 3))):
            got = np.linalg.solve(A, bb)
            got = got.to_numpy() if isinstance(got, bl.Matrix) else np.asarray(got)
            assert got.dtype == want.dtype
            assert_solve(got, want, a.astype(want.dtype), dtype=want.dtype)
    assert not [p for p in tmp_path.rglob("blocklin-upcast-*")]  # the promoted copies are removed
    with pytest.raises(bl.errors.DTypeError, match="share one dtype"):  # blocklin's own API: as documented
        bl.solve(A, B)


@pytest.mark.parametrize("da,db", [(np.float32, np.float64), (np.float64, np.float32), (np.float32, np.complex128),
                                   (np.float32, np.int64), (np.int64, np.float32)])
def test_numpy_lstsq_of_two_precisions_is_computed_in_numpys_dtype(tmp_path, da, db):
    """``np.linalg.lstsq(M, b)`` of a float32 ``M`` and a float64 ``b`` returned float64 arrays computed by a
    float32 SVD (relative error ~1e-7 where NumPy's is ~1e-16). NumPy solves in the promoted dtype; so does
    the protocol now, integers counting as the float64 NumPy casts them to (float32 with an integer ``b`` had
    still been a float32 SVD in a float64 result). Bound: the least-squares forward error of a backward-stable solve in that dtype,
    ``c n eps (kappa + kappa^2 ||r|| / (||A|| ||x||))`` (Higham, Thm 20.1), with ``c = 8`` as assert_solve."""
    rng = np.random.default_rng(7)
    m, n = 60, 8
    a = (4 * rng.standard_normal((m, n))).astype(da)  # integers of a few values: of full rank still
    b = (4 * rng.standard_normal((m, 2))).astype(db)
    A = bl.from_array(a, tmp_path / "a.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("error", bl.errors.BlocklinWarning)  # computed in NumPy's dtype: nothing to say
        x, res, rank, s = np.linalg.lstsq(A, b, rcond=None)
    want = np.linalg.lstsq(a, b, rcond=None)
    assert (x.dtype, res.dtype, s.dtype, rank) == (want[0].dtype, want[1].dtype, want[3].dtype, want[2])
    a64 = a.astype(np.complex128)
    kappa = np.linalg.cond(a64)
    r = np.linalg.norm(b - a64 @ want[0])
    e = eps(want[0].dtype)
    bound = 8 * n * e * (kappa + kappa ** 2 * r / (np.linalg.norm(a64, 2) * np.linalg.norm(want[0])))
    assert np.linalg.norm(x - want[0]) <= bound * np.linalg.norm(want[0])
    assert np.abs(s - want[3]).max() <= 4 * m * e * want[3][0]  # singular values: ||E||_2 bound (Weyl)
    assert not [p for p in tmp_path.rglob("blocklin-upcast-*")]


@pytest.mark.parametrize("call", ["solve", "lstsq"])
def test_numpy_upcast_copy_is_checked_against_the_temp_dirs_space_first(tmp_path, monkeypatch, call):
    """The float64 copy of a stored float32 operand that ``np.linalg.solve``/``lstsq`` of two precisions makes
    under the temp dir is checked against its free space before anything is written, as every temporary store
    is, and the refusal names the temp dir, the copy and the fixes (converting the operand once among them).
    The copy's own check had named its work folder, which is removed with the error, and no conversion."""
    import shutil

    import blocklin.storage.convert
    from blocklin.config import get_config
    from blocklin.storage import space

    rng = np.random.default_rng(8)
    n = 30
    a = (rng.standard_normal((n, n)) + n * np.eye(n)).astype(np.float32)
    A = bl.from_array(a, tmp_path / "a.zarr")
    real = shutil.disk_usage
    monkeypatch.setattr(space.shutil, "disk_usage", lambda p: real(p)._replace(free=1000))

    def no_copy(*args, **kwargs):
        raise AssertionError("the copy was started before its space was checked")

    monkeypatch.setattr(blocklin.storage.convert, "convert", no_copy)
    temp = os.path.abspath(str(get_config().temp_dir))
    with pytest.raises(bl.errors.DiskSpaceError) as info:
        getattr(np.linalg, call)(A, rng.standard_normal(n))
    message = str(info.value)
    assert message.startswith("a's float64 copy (NumPy's promotion of float32 a) in the temp dir: must fit the free "
                              "space of its destination; got 7.03 KiB (30 x 30 float64 of "), message
    assert f"Fix: free space in {temp}, or point the temp dir at a larger disk" in message, message
    assert message.endswith(f"or convert a once and pass the copy (blocklin convert {A.path} OUT.zarr --dtype "
                            "float64)"), message
    assert not [p for p in os.listdir(temp) if p.startswith("blocklin-upcast-")]


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128])
def test_numpy_svd_hermitian_is_checked_not_ignored(tmp_path, dtype):
    """``np.linalg.svd(M, hermitian=True)`` had been accepted and ignored. NumPy's ``hermitian=True`` takes the
    SVD from ``eigh`` of one triangle, so a non-Hermitian input gets another matrix's SVD (singular values 0.5
    off for a 60 x 60 Gaussian); blocklin now checks the promise, one pass over the tiles against their mirror
    tiles, and refuses a broken one naming the asymmetry. A Hermitian ``M`` (formed in floating point, so with
    rounding in its asymmetry) gets its SVD, NumPy's singular values to the Weyl bound of two SVDs
    (support.tolerances.assert_singular_values) and ``U S V^H = M`` to ``8 n eps ||M||_F``."""
    from support.tolerances import assert_singular_values

    rng = np.random.default_rng(11)
    n = 60
    b = rng.standard_normal((n, n)) + (1j * rng.standard_normal((n, n)) if dtype == np.complex128 else 0)
    h = (b @ b.conj().T - 30 * np.eye(n)).astype(dtype)  # indefinite
    upper = np.triu_indices(n, 1)
    h[upper] *= np.asarray(1 + 4 * eps(dtype), dtype=h.real.dtype)  # Hermitian up to rounding, as a computed one
    assert 0 < np.linalg.norm(h - h.conj().T) <= 16 * eps(dtype) * np.linalg.norm(h)
    H = bl.from_array(h, tmp_path / "h.zarr", chunks=(16, 16))  # mirror tiles of edge and inner sizes
    U, s, Vh = np.linalg.svd(H, full_matrices=False, hermitian=True)
    U, Vh = (x.to_numpy() if isinstance(x, bl.Matrix) else x for x in (U, Vh))
    assert_singular_values(s, np.linalg.svd(h, compute_uv=False, hermitian=True), n=n, dtype=dtype)
    e = eps(dtype)
    assert np.linalg.norm((U * s) @ Vh - h) <= 8 * n * e * np.linalg.norm(h)
    assert_singular_values(np.linalg.svd(H, compute_uv=False, hermitian=True), s, n=n, dtype=dtype)
    kind = "Hermitian" if dtype == np.complex128 else "symmetric"
    rtol = np.sqrt(eps(dtype))  # the tolerance of eigsh's and the Cholesky's checks
    off = np.triu(b, 1) * (np.linalg.norm(h) / np.linalg.norm(np.triu(b, 1)))  # ||A - A^H||_F = ||off||_F = ||h||_F
    near = (h + rtol / 4 * off).astype(dtype)  # within the tolerance: taken
    assert_singular_values(np.linalg.svd(bl.from_array(near, tmp_path / "near.zarr", chunks=(16, 16)),
                                         compute_uv=False, hermitian=True),
                           np.linalg.svd(near, compute_uv=False), n=n, dtype=dtype)
    for bad in (b.astype(dtype), (h + 4 * rtol * off).astype(dtype)):  # off far, and off 4x the tolerance
        B = bl.from_array(bad, tmp_path / f"b{len(list(tmp_path.iterdir()))}.zarr", chunks=(16, 16))
        with pytest.raises(bl.errors.NotSymmetricError, match=rf"^a: must be {kind} for hermitian=True .*got "
                           r"relative asymmetry .*Fix: pass hermitian=False"):
            np.linalg.svd(B, full_matrices=False, hermitian=True)
        with pytest.raises(bl.errors.NotSymmetricError):
            np.linalg.svd(B, compute_uv=False, hermitian=True)
    R = bl.from_array(rng.standard_normal((n, 20)).astype(dtype), tmp_path / "r.zarr")
    with pytest.raises(bl.errors.NotSquareError, match="^a: must be square for hermitian=True"):
        np.linalg.svd(R, full_matrices=False, hermitian=True)


def test_spectral_norm_of_a_stored_sparse_integer_matrix(tmp_path):
    """``norm(S, 2)`` of an integer sparse matrix (a pattern or count matrix: the sparse SVD multiplies it as
    float64) had raised a ValueError from ``np.finfo`` of its dtype (found by a randomized search, 2026-12-07);
    the other orders took it. Bound: the Lanczos residual tolerance ``10 sqrt(eps)``, squared over the gap,
    as in the float64 case above (``100 eps``)."""
    import scipy.sparse

    x = np.array([[3, 0, -1, 0], [0, 2, 0, 0], [4, 0, 0, 7], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=np.int64)
    s = bl.from_sparse(scipy.sparse.csr_matrix(x), tmp_path / "s.zarr")
    assert s.dtype == np.int64
    want = np.linalg.norm(x.astype(np.float64), 2)
    assert bl.norm(s, 2) == pytest.approx(want, rel=100 * eps(np.float64))
    assert np.linalg.norm(s, 2) == pytest.approx(want, rel=100 * eps(np.float64))


@pytest.mark.parametrize("dtype", [np.int8, np.int64])
def test_entrywise_norms_of_a_sparse_matrix_holding_its_integer_minimum(tmp_path, dtype):
    """``np.abs`` of a signed integer's minimum is itself (int8 ``|-128| = -128``): the sparse norms took the
    absolute values before the cast to float64, so ``norm(S, 1)`` of a column ``[-128, -128]`` came back 1.0
    (the other column's), ``-1`` as -256 and ``inf`` as 1.0, without a word (found by a randomized search,
    2026-12-07). Exact: the sums of two or three integers below 2^64 are exact in float64 up to one rounding,
    ``2 eps`` relative."""
    import scipy.sparse

    low = np.iinfo(dtype).min
    x = np.array([[low, 0, 0], [low, 0, 0], [0, 0, 1]], dtype=dtype)
    s = bl.from_sparse(scipy.sparse.csr_matrix(x), tmp_path / "s.zarr")
    for ord in (None, "fro", 1, -1, np.inf, -np.inf):
        want = np.linalg.norm(x.astype(np.float64), ord)
        assert bl.norm(s, ord) == pytest.approx(want, rel=2 * eps(np.float64), abs=0), ord


def test_asarray_of_a_stored_sparse_matrix_is_its_dense_array(tmp_path):
    """``np.asarray(S)`` of a ``SparseMatrix`` had been a 0-d object array holding the handle (no ``__array__``):
    ``np.asarray(S).sum()`` returned ``S`` itself and ``.shape`` was ``()``, without an error (found by a
    randomized search, 2026-12-07). It is the dense matrix now, as a ``Matrix``'s (exact: the stored values);
    ``copy=False`` is refused with NumPy's ``ValueError``."""
    import scipy.sparse

    x = scipy.sparse.random(7, 5, density=0.4, random_state=2, format="csr")
    s = bl.from_sparse(x, tmp_path / "s.zarr")
    for got in (np.asarray(s), np.array(s), np.asarray(s, dtype=np.float32)):
        assert got.shape == (7, 5) and np.array_equal(got, x.toarray().astype(got.dtype))
    assert np.asarray(s).sum() == pytest.approx(x.sum(), rel=8 * eps(np.float64))
    with pytest.raises(ValueError, match=r"^copy: must not be False for a blocklin\.SparseMatrix"):
        np.asarray(s, copy=False)
