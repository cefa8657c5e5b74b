"""``check_finite=False`` skips the NaN/Inf check, never the meaning of NaN and Inf: the entry-wise
results (norms, products) propagate them as NumPy's do, and the decompositions, which have no answer
on them, refuse the data with :class:`~blocklin.errors.NonFiniteError`: never finite wrong numbers,
an empty result or an internal error."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import zarr

import blocklin as bl
from blocklin.errors import BlocklinWarning, NonFiniteError

OFF = {"check_finite": False}
#: the whole matrix in one task, and strips streamed over several tasks (the merge of their states)
BUDGETS = ({}, {"memory": "64KiB"})
ENTRYWISE = (None, "fro", 1, -1, np.inf, -np.inf)


def same(got: float, want: float) -> bool:
    """Equal, NaN equal to NaN."""
    return (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, rel=1e-12)


@pytest.fixture
def unwritten(tmp_path):
    """A store whose third row chunk was never written: its fill value, NaN, reads back there."""
    t = np.random.default_rng(2).standard_normal((300, 20))
    path = str(tmp_path / "nan.zarr")
    a = zarr.create_array(store=path, shape=t.shape, chunks=(64, 20), dtype="f8", compressors=None,
                          fill_value=np.nan)
    for i in range(0, 300, 64):
        if i // 64 != 2:
            a[i:i + 64] = t[i:i + 64]
    return path, zarr.open_array(path)[...]


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("ord", ENTRYWISE)
def test_entrywise_norms_of_an_unwritten_chunk_are_nan(unwritten, ord, budget):
    path, x = unwritten
    with np.errstate(invalid="ignore"):
        want = float(np.linalg.norm(x, ord))
    assert math.isnan(want)
    assert math.isnan(bl.norm(path, ord, **OFF, **budget))


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "nan+inf"])
@pytest.mark.parametrize("ord", ENTRYWISE)
def test_entrywise_norms_follow_numpy(ord, bad, budget):
    y = np.random.default_rng(2).standard_normal((300, 20))
    if "nan" in bad:
        y[5, 7] = np.nan
    if "inf" in bad:
        y[250, 3] = -np.inf if bad == "-inf" else np.inf
    with np.errstate(invalid="ignore"):
        want = float(np.linalg.norm(y, ord))
    assert same(bl.norm(y, ord, **OFF, **budget), want), (ord, bad, want)


@pytest.mark.parametrize("value", [complex(np.inf, np.nan), complex(np.nan, 0.0), complex(np.inf, 1.0)])
@pytest.mark.parametrize("ord", ENTRYWISE)
def test_entrywise_norms_of_complex_data_follow_numpy(ord, value):
    rng = np.random.default_rng(3)
    y = rng.standard_normal((40, 6)) + 1j * rng.standard_normal((40, 6))
    y[7, 2] = value
    with np.errstate(invalid="ignore"):
        want = float(np.linalg.norm(y, ord))
    assert same(bl.norm(y, ord, **OFF), want), (ord, value, want)


def test_finite_norms_are_unchanged():
    z = np.random.default_rng(4).standard_normal((300, 20))
    y = z * 1e200  # squares beyond float64: the scaled sum of squares (NumPy's own overflows to inf)
    for ord in ENTRYWISE:
        for budget in BUDGETS:
            assert bl.norm(y, ord, **OFF, **budget) == pytest.approx(1e200 * np.linalg.norm(z, ord), rel=1e-12)


def _refused(call) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no result with a warning either: the refusal itself
        with pytest.raises(NonFiniteError) as err:
            call()
    msg = str(err.value)
    assert "check_finite=False" in msg and "must be finite" in msg and "Fix:" in msg
    return msg


@pytest.mark.parametrize("method", ["auto", "gram", "rsvd", "lanczos", "full", "sketch"])
@pytest.mark.parametrize("memory", ["1MiB", "256KiB"])  # in memory (300 x 20) / streamed (3000 x 20)
def test_svd_of_nan_or_inf_is_refused(method, memory):
    m = 300 if memory == "1MiB" else 3000
    y = np.random.default_rng(2).standard_normal((m, 20))
    y[m // 2, 7] = np.nan
    assert "a NaN" in _refused(lambda: bl.svd(y, 3, method=method, seed=0, memory=memory, **OFF))
    y[m // 2, 7] = np.inf
    assert "an Inf" in _refused(lambda: bl.svd(y, 3, method=method, seed=0, memory=memory,
                                               return_singular_vectors=False, **OFF))


def test_operations_on_an_svd_refuse_an_unwritten_chunk(unwritten):
    path, _ = unwritten
    s = {"memory": "1MiB", **OFF}
    _refused(lambda: bl.svd(path, 3, return_singular_vectors=False, seed=0, **s))
    _refused(lambda: bl.pca(path, 2, seed=0, **s))
    for ord in (2, -2, "nuc"):
        _refused(lambda: bl.norm(path, ord, **s))
    _refused(lambda: bl.cond(path, **s))


def test_eigsh_of_nan_is_refused():
    q = np.random.default_rng(1).standard_normal((40, 40))
    q = q + q.T
    q[3, 5] = q[5, 3] = np.nan
    assert "eigsh" in _refused(lambda: bl.eigsh(q, 2, **OFF))


def test_products_propagate_nan_as_numpy(unwritten):
    path, x = unwritten
    g = np.asarray(bl.gram(path, memory="1MiB", **OFF))
    np.testing.assert_array_equal(np.isnan(g), np.isnan(x.T @ x))
    b = np.ones((20, 3))
    c = np.asarray(bl.matmul(path, b, memory="1MiB", **OFF))
    np.testing.assert_array_equal(np.isnan(c), np.isnan(x @ b))
    np.testing.assert_allclose(c[~np.isnan(c)], (x @ b)[~np.isnan(x @ b)])


def test_det_of_nan_is_nan():
    a = np.random.default_rng(3).standard_normal((30, 30))
    a[4, 4] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert math.isnan(bl.det(a, **OFF))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("memory", ["96KiB", "64MiB"])  # tiles / one block in memory
def test_factorizations_name_nan_or_inf_not_a_singular_matrix(bad, memory):
    """With ``check_finite=False`` a NaN or an Inf had been reported as an exact zero pivot (``lu``,
    ``solve``), a numerically singular matrix (``inv``, ``cond(p='fro')``) or a rank deficiency (``qr``):
    the maxima the factorizations keep had dropped it (Python's ``max`` keeps its first argument before
    a NaN). The solves and inverses now refuse it by name; ``lu`` returns getrf's factors (as SciPy's
    ``lu_factor`` does) with a warning that says so; ``det`` is NumPy's."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((60, 60)) + 8 * np.eye(60)
    a[5, 7] = bad
    t = rng.standard_normal((180, 60))
    t[5, 7] = bad
    b = rng.standard_normal((60, 1))
    for call in (lambda: bl.solve(a, b, memory=memory, **OFF), lambda: bl.inv(a, memory=memory, **OFF),
                 lambda: bl.inv(a, memory=memory, precision="mixed", **OFF),
                 lambda: bl.cond(a, "fro", memory=memory, **OFF)) + \
            ((lambda: bl.qr(t, memory=memory, **OFF)),) * (memory != "96KiB"):  # the tiled QR needs more
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's, of arithmetic on Inf before the refusal
            with pytest.raises(NonFiniteError, match=r"must be finite for .*check_finite=False.*Fix:"):
                call()
    with pytest.warns(BlocklinWarning, match="lu: A holds (NaN|Inf) .check_finite=False"):
        bl.lu(a, memory=memory, **OFF)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = np.linalg.det(a)
        got = bl.det(a, memory=memory, **OFF)
    assert same(got, want), (got, want)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("options", [{}, {"lam": 1.0, "fit_intercept": True}, {"lam": 1.0, "method": "qr"}])
def test_a_wide_solve_names_nan_or_inf(bad, options):
    """A wide ``A`` (the dual form, or the QR route of ``A^T``) holding a NaN or an Inf with ``check_finite=False``
    is refused by name, as a tall one is: its ``A A^T`` (or ``R``) had reached NumPy's eigensolver (SVD), whose
    ``LinAlgError: Eigenvalues did not converge`` came back instead (a randomized search)."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((8, 17))
    a[2, 3] = bad
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's, of arithmetic on Inf before the refusal
        with pytest.raises(NonFiniteError, match=r"a: must be finite for a least-squares or ridge solve.*Fix:"):
            bl.solve(a, rng.standard_normal((8, 1)), **options, **OFF)


def test_a_wide_ridge_over_the_gram_budget_names_nan(tmp_path):
    """The wide ridge's GEMM fallback (the SYRK pass over the budget) of a stored ``A`` holding a NaN: refused
    as NaN, not as a budget (its range check had read the NaN diagonal as data beyond the range and said to
    raise memory=)."""
    t = np.random.default_rng(0).standard_normal((5, 21))
    t[2, 3] = np.nan
    a = bl.from_array(t, tmp_path / "t.zarr", chunks=(3, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(NonFiniteError, match=r"a: must be finite for a least-squares or ridge solve.*nan"):
            bl.solve(a, np.ones(5), lam=1e-3, memory="2KiB", **OFF)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("shape", [(8, 4), (4, 8)], ids=["tall", "wide"])
def test_complex_lstsq_names_nan_or_inf(bad, shape):
    """Complex ``lstsq`` (the streaming R factor's route) of an ``A`` holding a NaN or an Inf with
    ``check_finite=False`` is refused by name, as the real route's SVD refuses it: its non-finite ``R`` had
    reached NumPy's SVD, whose ``LinAlgError: SVD did not converge`` came back instead (a randomized search)."""
    rng = np.random.default_rng(6)
    a = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
    a[1, 2] = bad
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's, of arithmetic on Inf before the refusal
        with pytest.raises(NonFiniteError, match=r"a: must be finite for lstsq.*check_finite=False.*Fix:"):
            bl.lstsq(a, rng.standard_normal(shape[0]), **OFF)
