"""Ridge and least-squares solutions at the ends of the dtype's range: ``x(2^p A, 2^q b, 2^p lam) =
2^(q - p) x(A, b, lam)`` exactly in binary floating point, so the solution of the scaled problem is the
unscaled problem's solution, rescaled by a power of two and rounded once into the output.

The routes solve the problem scaled by powers of two (``blocklin.linalg.blocks.scaling``) and undo the scaling
on ``x``: the wide routes applied it as the GEMM's ``alpha = 2^s``, which underflowed to 0 for ``A`` near
``2^1021`` and ``b`` near 1 (``x`` near ``1e-308``: returned as ``x = 0`` without a word) and overflowed beyond
``2^1023`` (refused naming the internal ``alpha``); the tall routes rounded ``x`` once but a column flushed to 0
came back as 0 and a subnormal one without a warning. Now, as the square solve (``test_square_equilibration``):
a subnormal ``x`` warns, an ``x`` flushed to 0 or beyond the range is refused naming ``b`` and the power of two.

Bound. Both solves run the same route on data that differ by powers of two; each is within ``c n eps cond``
of the exact solution (Cholesky of ``K = A^T A + lam^2 I`` or of ``A A^T + lam^2 I``, or the QR of
``[A; lam I]``: Higham 2002, Thms 10.4 and 20.3), and ``cond(K) <= 1 + (sigma_1 / lam)^2``, below 40 for the
Gaussian 6 x 15 (40 x 6) ``A`` and ``lam = 1`` here; so the two agree to ``2 * 8 n eps cond(K)`` relative,
plus the one rounding into the subnormal range, half the smallest subnormal per entry.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import BlocklinWarning, ParameterError
from blocklin.runtime.powers import ldexp
from support.tolerances import fro_norm

ROUTES = {
    "wide gram": ((6, 15), {}),
    "wide qr": ((6, 15), {"method": "qr"}),
    "wide intercept": ((6, 15), {"fit_intercept": True}),
    "wide qr intercept": ((6, 15), {"fit_intercept": True, "method": "qr"}),
    "wide weights": ((6, 15), {"sample_weight": np.linspace(0.5, 2.0, 6)}),
    "tall normal": ((40, 6), {}),
    "tall qr": ((40, 6), {"method": "qr"}),
    "tall intercept": ((40, 6), {"fit_intercept": True}),
    "tall weights": ((40, 6), {"sample_weight": np.linspace(0.5, 2.0, 40)}),
}


def problem(shape, dtype, seed=0, k=2):
    rng = np.random.default_rng(seed)
    cplx = np.dtype(dtype).kind == "c"
    a = rng.standard_normal(shape) + (1j * rng.standard_normal(shape) if cplx else 0)
    b = rng.standard_normal((shape[0], k)) + (1j * rng.standard_normal((shape[0], k)) if cplx else 0)
    return a.astype(dtype), b.astype(dtype)


def solve_scaled(a, b, p, q, lam=1.0, **kw):
    return np.asarray(bl.solve(ldexp(a, p), ldexp(b, q), lam=float(np.ldexp(lam, p)), **kw))


def assert_rescaled(got, a, b, e, lam=1.0, **kw):
    """``got`` against the unscaled problem's solution times ``2^e``, rounded once (module docstring)."""
    dt = np.dtype(got.dtype)
    ref = np.asarray(bl.solve(a, b, lam=lam, **kw))
    n = ref.shape[0]
    work = np.complex128 if dt.kind == "c" else np.float64
    expect = ldexp(ref.astype(work), e)
    fi = np.finfo(dt)
    # fro_norm: NumPy's norm of an x near 2^600 overflowed to Inf, and Inf <= Inf had passed any error
    bound = 2 * 8 * n * float(fi.eps) * 40 * fro_norm(expect) + np.sqrt(expect.size) * float(fi.smallest_subnormal)
    err = fro_norm(got.astype(work) - expect)
    assert np.abs(got).max() > 0, "x flushed to 0"
    assert np.isfinite(bound) and err <= bound, f"||x - 2^e x(A, b)|| = {err:.3e} > {bound:.3e}"


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("route", sorted(ROUTES))
def test_subnormal_x_is_kept_and_warned(route):
    """``A`` near ``2^1021``, ``b`` near 1: ``x`` near ``2^-1021`` (the wide routes had returned 0), with
    blocklin's warning alone (the tall intercept and weighted routes had leaked NumPy's overflow warnings of
    the first pass, which the solve repeats scaled)."""
    shape, kw = ROUTES[route]
    a, b = problem(shape, np.float64)
    with pytest.warns(BlocklinWarning, match="x is subnormal"):
        got = solve_scaled(a, b, 1021, 0, **kw)
    assert np.abs(got).max(axis=0).min() < np.finfo(np.float64).tiny  # a column subnormal
    assert_rescaled(got, a, b, -1021, **kw)


@pytest.mark.parametrize("route", ["wide gram", "wide intercept", "tall normal", "tall qr"])
def test_deep_subnormal_x(route):
    """``x`` near ``2^-1060``, a dozen bits left: answered to the smallest subnormal, with the warning."""
    shape, kw = ROUTES[route]
    a, b = problem(shape, np.float64, seed=1)
    with pytest.warns(BlocklinWarning, match="x is subnormal"):
        got = solve_scaled(a, b, 1000, -60, **kw)
    assert_rescaled(got, a, b, -1060, **kw)


@pytest.mark.parametrize("dtype", [np.float32, np.complex64, np.complex128])
@pytest.mark.parametrize("route", ["wide gram", "wide intercept", "tall normal"])
def test_subnormal_x_other_dtypes(route, dtype):
    shape, kw = ROUTES[route]
    a, b = problem(shape, dtype, seed=2)
    p, q = (100, -40) if np.finfo(dtype).bits == 32 else (1000, -60)
    with pytest.warns(BlocklinWarning, match="x is subnormal"):
        got = solve_scaled(a, b, p, q, **kw)
    assert got.dtype == np.dtype(dtype)
    assert_rescaled(got, a, b, q - p, **kw)


def test_normal_range_x_does_not_warn():
    a, b = problem((6, 15), np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BlocklinWarning)
        got = solve_scaled(a, b, 1000, 0)
    assert_rescaled(got, a, b, -1000)


def test_lam_list_subnormal():
    """Every lambda of a list (the spectral route) is rescaled and judged."""
    a, b = problem((6, 15), np.float64, k=1)
    lams = [1.0, 3.0]
    with pytest.warns(BlocklinWarning, match="x is subnormal"):
        got = np.asarray(bl.solve(ldexp(a, 1000), ldexp(b, -60), lam=[float(np.ldexp(v, 1000)) for v in lams]))
    for j, lam in enumerate(lams):
        assert_rescaled(got[:, j:j + 1], a, b, -1060, lam=lam)


@pytest.mark.parametrize(("ea", "eb", "where"), [(1000, -100, r"flushed to 0.*scale b by 2\^1"),
                                                 (-1000, 30, r"beyond.*scale b by 2\^-10")], ids=["below", "beyond"])
@pytest.mark.parametrize("route", sorted(ROUTES))
def test_x_out_of_range_refused(route, ea, eb, where):
    """``x`` near ``2^-1100`` (below the smallest subnormal) or ``2^1030``: refused naming ``b`` and the power of
    two (the wide routes had returned 0, or named the GEMM's ``alpha``)."""
    shape, kw = ROUTES[route]
    a, b = problem(shape, np.float64)
    with pytest.raises(ParameterError, match=r"^b: must give a solution x within the range of float64.*" + where):
        solve_scaled(a, b, ea, eb, **kw)


def test_float32_x_below_range_refused():
    a, b = problem((40, 6), np.float32)
    with pytest.raises(ParameterError, match=r"^b: must give a solution x within the range of float32"):
        solve_scaled(a, b, 100, -80)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128, np.float32])
@pytest.mark.parametrize("shape", [(40, 6), (6, 15)], ids=["tall", "wide"])
def test_lstsq_subnormal_x(shape, dtype):
    """``blocklin.lstsq``: ``x = V S^+ U^H b`` formed as ``2^e`` times a solution near 1 and rounded once (the
    quotients ``c / s`` had been subnormal, an ``x`` below the range 0), with the warning. Bound: the SVD
    solution's ``c n eps cond(A)`` (Higham 2002, 20.1) on both, ``cond(A)`` below 10 for these Gaussian shapes."""
    a, b = problem(shape, dtype, seed=4)
    p, q = (100, -40) if np.finfo(dtype).bits == 32 else (1000, -60)
    with pytest.warns(BlocklinWarning, match="lstsq: x is subnormal"):
        got = bl.lstsq(ldexp(a, p), ldexp(b, q))[0]
    ref = bl.lstsq(a, b)[0]
    work = np.complex128 if np.dtype(dtype).kind == "c" else np.float64
    expect = ldexp(ref.astype(work), q - p)
    fi = np.finfo(dtype)
    bound = 2 * 8 * max(shape) * float(fi.eps) * 10 * np.linalg.norm(expect) + np.sqrt(expect.size) * float(
        fi.smallest_subnormal)
    assert np.abs(got).max() > 0 and np.linalg.norm(got.astype(work) - expect) <= bound


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("shape", [(40, 6), (6, 15)], ids=["tall", "wide"])
def test_lstsq_x_below_range_refused(shape, dtype):
    a, b = problem(shape, dtype, seed=4)
    with pytest.raises(ParameterError, match=rf"^b: must give a solution x within the range of {np.dtype(dtype).name}"
                       r".*flushed to 0"):
        bl.lstsq(ldexp(a, 1000), ldexp(b, -100))


@pytest.mark.parametrize("gap", [106, 444])
@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("route", sorted(r for r in ROUTES if r.startswith("wide")))
def test_wide_columns_apart_each_keep_their_range(route, dtype, gap):
    """``A`` near ``2^1008`` (``y = (A A^H + lam^2 I)^-1 b`` near ``2^-1010`` for ``b`` near ``2^1006``) and a column
    of ``b`` ``2^gap`` below the other: the wide routes brought ``y`` into the normal range by one power of two,
    the largest column's, which left the other among the subnormals (``gap = 106``: ``x`` 0.8% off) or flushed
    it (``gap = 444``: ``x = 0``), without a word. Each column has its own power now: within the module
    docstring's bound of ``2^(q_j - 1008) x(A, b_j)``."""
    shape, kw = ROUTES[route]
    if np.dtype(dtype).kind == "c" and "sample_weight" in kw:
        kw = {}
    a, b = problem(shape, dtype)
    q = np.array([1006, 1006 - gap])
    x = np.asarray(bl.solve(ldexp(a, 1008), ldexp(b, q[None, :]), lam=float(np.ldexp(1.0, 1008)), **kw))
    for j in range(2):
        assert_rescaled(x[:, j:j + 1], a, b[:, j:j + 1], int(q[j]) - 1008, **kw)


@pytest.mark.parametrize(("dtype", "q"), [(np.float64, 600), (np.complex128, 600), (np.float32, 100)])
@pytest.mark.parametrize("route", sorted(ROUTES))
def test_ridge_columns_far_apart_sequence(route, dtype, q):
    """Columns of ``b`` near ``2^q`` and ``2^-q`` (2^1200 apart in float64, 2^200 in float32) with a sequence of
    lambdas. Its routes scaled ``b`` by one power of two, its largest entry's: the small column was flushed to 0
    and its ``x`` came back as 0 without a word, a relative error of 1 (found by a randomized search), then was
    refused naming ``b``. Each column is now divided by its own power of two (as with one ``lam``:
    ``test_tall_columns_far_apart_answered``): every lambda's block of columns is ``2^q_j`` times the column
    solved alone, within the module docstring's bound (``tests/solve/test_ridge_rules_columns_apart.py`` checks
    the rules and the reported norms against NumPy)."""
    shape, kw = ROUTES[route]
    if np.dtype(dtype).kind == "c" and "sample_weight" in kw:
        kw = {}
    a, b = problem(shape, dtype)
    x = np.asarray(bl.solve(a, ldexp(b, np.array([q, -q])[None, :]), lam=[1.0, 2.0], **kw))
    for i, lam in enumerate((1.0, 2.0)):  # cond(K) below its value at lam = 1 (module docstring)
        for j, e in enumerate((q, -q)):
            assert_rescaled(x[:, 2 * i + j:2 * i + j + 1], a, b[:, j:j + 1], e, lam=lam, **kw)


def ridge_reference(a, b, lam, w=None):
    """Each column of ``b`` solved alone with NumPy on the ridge-augmented system ``[W^1/2 A; lam I] x =
    [W^1/2 b; 0]`` (``numpy.linalg.lstsq``, Householder QR / SVD in float64 or complex128)."""
    work = np.complex128 if np.dtype(a.dtype).kind == "c" else np.float64
    n = a.shape[1]
    r = np.ones(a.shape[0]) if w is None else np.sqrt(w)
    aug = np.vstack([r[:, None] * a.astype(work), lam * np.eye(n, dtype=work)])
    return np.stack([np.linalg.lstsq(aug, np.concatenate([r * b[:, j].astype(work), np.zeros(n, work)]),
                                     rcond=None)[0] for j in range(b.shape[1])], axis=1)


@pytest.mark.parametrize("method", ["auto", "normal", "qr", "weights", "intercept", "qr intercept"])
@pytest.mark.parametrize(("dtype", "q"), [(np.float64, 600), (np.complex128, 600), (np.float32, 100)])
def test_tall_columns_far_apart_answered(dtype, q, method):
    """Columns of ``b`` near ``2^q`` and ``2^-q`` on the tall routes (normal equations, streaming QR): one power of
    two for ``b`` flushed the small column (refused since); each column is its own problem, now scaled by its own
    power as the passes read it (the normal route's ``A^T b`` sums, the QR's streamed ``[A | b]`` rows, the
    refinement pass's residuals), and answered.

    Bound, per column: ``x_j = 2^q_j x(A, b_j)`` exactly in binary floating point, and the route's solution of
    the scaled problem is within ``c n eps cond(K)`` of the exact one (Cholesky of ``K = A^T A + lam^2 I`` or the
    QR of ``[A; lam I]``: Higham 2002, Thms 10.4 and 20.3; ``c = 8``), ``cond(K) = (s_1^2 + lam^2) / (s_n^2 +
    lam^2)``; the reference (NumPy's least squares on the augmented system in float64) is within the same; the
    rounding into the output dtype adds ``eps``. So ``||x_j 2^-q_j - ref_j|| <= (2 * 8 n eps cond(K) + eps)
    ||ref_j||`` with ``eps`` of the data's dtype. With sample weights ``w`` in ``[0.5, 2]`` the same for
    ``W^1/2 A``. With ``fit_intercept`` the reference solves the centered ``A``, ``b`` and the intercept is
    ``bbar - mu^T x``: its error within that relative bound of ``|bbar_j| + ||mu|| ||x_j||``."""
    a, b = problem((40, 6), dtype, seed=3)
    lam = 1.0
    e = np.array([q, -q])
    w = np.linspace(0.5, 2.0, 40) if method == "weights" else None
    kw = {} if method == "auto" else {"sample_weight": w} if w is not None else {"method": method}
    if method.endswith("intercept"):
        kw = {"fit_intercept": True} | ({"method": "qr"} if method.startswith("qr") else {})
        a, b = a + 3, b + 5  # means beside the spread
    x = bl.solve(a, ldexp(b, e[None, :]), lam=lam, **kw)
    icpt = x.intercept
    assert x.report["scaling"]["exponent_b"] == [q + int(np.frexp(np.abs(b[:, 0]).max())[1]),
                                                 -q + int(np.frexp(np.abs(b[:, 1]).max())[1])]
    x = np.asarray(x)
    work = np.complex128 if np.dtype(dtype).kind == "c" else np.float64
    mu, bbar = a.astype(work).mean(axis=0), b.astype(work).mean(axis=0)
    ac, bc = (a - mu, b - bbar) if icpt is not None else (a, b)
    ref = ridge_reference(ac, bc, lam, w)
    s = np.linalg.svd(ac.astype(work) * (1.0 if w is None else np.sqrt(w)[:, None]), compute_uv=False)
    cond = (s[0] ** 2 + lam ** 2) / (s[-1] ** 2 + lam ** 2)
    eps = float(np.finfo(dtype).eps)
    rel = 2 * 8 * a.shape[1] * eps * cond + eps
    for j in range(2):
        got = ldexp(x[:, j].astype(work), -int(e[j]))
        err, size = np.linalg.norm(got - ref[:, j]), np.linalg.norm(ref[:, j])
        assert err <= rel * size, (j, err / size)
        if icpt is not None:
            c = ldexp(np.asarray(icpt, dtype=work)[j:j + 1], -int(e[j]))[0]
            want = bbar[j] - mu @ ref[:, j]
            assert abs(c - want) <= rel * (abs(bbar[j]) + np.linalg.norm(mu) * size), (j, abs(c - want))


@pytest.mark.parametrize(("dtype", "q"), [(np.float64, 600), (np.complex128, 600)])
@pytest.mark.parametrize("route", sorted(r for r in ROUTES if r.startswith("wide")))
def test_wide_columns_far_apart_answered(route, dtype, q):
    """Columns of ``b`` near ``2^q`` and ``2^-q`` on the wide routes (the dual form, in memory): one power of two
    for ``b`` (in float64) flushed the small column; refused since, now each column is scaled by its own power
    (``report["scaling"]["exponent_b"]`` lists them) and answered, within the module docstring's bound of
    ``2^q_j x(A, b_j)``: each column of ``x`` is its own problem, solved alone as the reference."""
    shape, kw = ROUTES[route]
    if np.dtype(dtype).kind == "c" and "sample_weight" in kw:
        kw = {}
    a, b = problem(shape, dtype)
    e = np.array([q, -q])
    x = bl.solve(a, ldexp(b, e[None, :]), lam=1.0, **kw)
    assert x.report["scaling"]["exponent_b"] == [int(e[j]) + int(np.frexp(np.abs(np.concatenate(
        [b[:, j].real, b[:, j].imag])).max())[1]) for j in range(2)]
    icpt = x.intercept
    x = np.asarray(x)
    for j in range(2):
        assert_rescaled(x[:, j:j + 1], a, b[:, j:j + 1], int(e[j]), **kw)
        if icpt is not None:  # bbar - mu^T x: x's relative bound times |bbar| + ||mu|| ||x|| (||mu|| <= max |a| sqrt(n))
            alone = bl.solve(a, b[:, j:j + 1], lam=1.0, **kw)
            want, xa = np.ravel(alone.intercept)[0], np.asarray(alone)
            got = ldexp(np.asarray(icpt)[j:j + 1], -int(e[j]))[0]
            rel = 2 * 8 * shape[1] * np.finfo(dtype).eps * 40
            assert abs(got - want) <= rel * (abs(want) + np.abs(a).max() * np.sqrt(shape[1]) * np.linalg.norm(xa)), j


@pytest.mark.parametrize("method", ["auto", "qr"])
def test_tall_columns_sharing_a_power_keep_their_bits(method):
    """``b``'s columns ``2^600`` and ``2^560`` times ordinary data: the one power of two ``2^-601`` keeps both within
    the range, so the passes scale ``b`` by that one power as before (the report's one ``exponent_b``), and ``x``
    is bit for bit ``2^q_j`` times the unscaled problem's (powers of two are exact and the rounding of every
    operation scales with them; no scaled value leaves the normal range)."""
    a, b = problem((40, 6), np.float64, seed=3)
    e = np.array([600, 560])
    kw = {} if method == "auto" else {"method": method}
    x = bl.solve(a, ldexp(b, e[None, :]), lam=1.0, **kw)
    assert isinstance(x.report["scaling"]["exponent_b"], int)
    ref = np.asarray(bl.solve(a, b, lam=1.0, **kw))
    np.testing.assert_array_equal(np.asarray(x), ldexp(ref, e[None, :]))


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("method", ["auto", "qr"])
def test_tall_columns_sharing_a_power_read_b_once_per_pass(method, dtype):
    """The check that no column of ``b`` is flushed by the one power of two (``refuse_flushed_rhs``) takes each
    column's largest entry from the first pass's record, which the per-column scaling keeps: it had read ``b``
    once more (``bytes_read`` one ``b`` above the passes'). Inputs held uncompressed: each pass reads ``a`` and
    ``b`` once."""
    a, b = problem((40, 6), dtype, seed=3)
    kw = {} if method == "auto" else {"method": method}
    x = bl.solve(a, ldexp(b, np.array([600, 560])[None, :]), lam=1.0, **kw)
    assert isinstance(x.report["scaling"]["exponent_b"], int) and x.report["passes"] == 2
    assert x.report["bytes_read"] == x.report["passes"] * (a.nbytes + b.nbytes)


@pytest.mark.parametrize("dtype", [np.complex128, np.float64])
@pytest.mark.parametrize("shape", [(40, 6), (6, 15)], ids=["tall", "wide"])
def test_lstsq_columns_far_apart(shape, dtype):
    """Columns of ``b`` near ``2^600`` and ``2^-600``: each column of ``x`` is its own problem, ``2^q_j x(A, b_j)``.
    The complex ``lstsq`` brought all columns near 1 by one power of two (the largest column's): the small one
    fell to ``2^-1200``, was flushed to 0, and its ``x`` came back as 0 without a word (relative error 1).
    Bound per column: the SVD solution's ``c n eps cond(A)`` (Higham 2002, 20.1) on both solves, ``cond(A)``
    below 10 for these Gaussian shapes (``test_lstsq_subnormal_x``)."""
    a, b = problem(shape, dtype, seed=4)
    q = np.array([600, -600])
    with warnings.catch_warnings():  # NumPy's overflow warnings had leaked from the residuals (Inf, as NumPy's)
        warnings.simplefilter("error", RuntimeWarning)
        got, res = bl.lstsq(a, ldexp(b, q[None, :]))[:2]
    ref = bl.lstsq(a, b)[0]
    if shape[0] > shape[1]:  # ||r_0||^2 near 2^1200: beyond float64's range, Inf as NumPy's lstsq gives
        assert np.isinf(res[0]) and np.isfinite(res[1])
    for j in range(2):
        err = np.linalg.norm(ldexp(got[:, j], -int(q[j])) - ref[:, j])
        assert err <= 2 * 8 * max(shape) * np.finfo(dtype).eps * 10 * np.linalg.norm(ref[:, j]), (j, err)


@pytest.mark.parametrize("shape", [(300, 64), (64, 300)], ids=["tall", "wide"])
def test_stored_gram_x_below_range_refused(shape):
    """The stored-Gram route (a Gram over the budget) sums unscaled squares: ``A`` near ``2^450`` and ``b`` near
    ``2^-640`` (``x`` near ``2^-1090``; the wide route's ``y`` near ``2^-1540`` for ``x`` near ``2^-1090``) had
    returned ``x = 0`` without a word; refused naming ``b`` and the power of two (the route solves for ``2^-e x``,
    ``b`` scaled near 1, and ``x`` is sized)."""
    from support.conformance import least_budget

    a, b = problem(shape, np.float64, seed=5)
    with pytest.raises(ParameterError, match=r"^b: must give a solution x within the range of float64.*flushed to 0"
                       r".*stored-Gram.*scale b by 2\^10"):
        least_budget(lambda memory: bl.solve(ldexp(a, 450), ldexp(b, -640), lam=float(np.ldexp(1.0, 450)),
                                             memory=memory))


@pytest.mark.parametrize("shape", [(300, 64), (64, 300)], ids=["tall", "wide"])
def test_stored_gram_x_beyond_range_refused(shape):
    """``A`` near ``2^-450`` and ``b`` near ``2^640`` (``x`` near ``2^1090``): the stored-Gram route's
    substitutions overflowed and it was refused as "t: ... a singular or overflowing diagonal tile" (naming an
    internal factor, and the wrong cause); it solves for ``2^-e x`` (``b`` scaled near 1) and refuses ``x``
    beyond the range naming ``b`` and the power of two, as the in-memory routes do."""
    from support.conformance import least_budget

    a, b = problem(shape, np.float64, seed=5)
    with pytest.raises(ParameterError, match=r"^b: must give a solution x within the range of float64.*beyond.*"
                       r"stored-Gram.*scale b by 2\^-10"):
        least_budget(lambda memory: bl.solve(ldexp(a, -450), ldexp(b, 640), lam=float(np.ldexp(1.0, -450)),
                                             memory=memory))


@pytest.mark.parametrize("shape", [(300, 64), (64, 300)], ids=["tall", "wide"])
def test_stored_gram_x_near_the_top_of_the_range(shape):
    """``x`` near ``2^1000`` (``A`` near ``2^-450``, ``b`` near ``2^550``): within the range, answered as the
    unscaled problem's solution times ``2^1000``. Bound as the module docstring's, with this ``A``'s
    ``cond(K) <= 1 + sigma_1^2`` (``lam = 1`` unscaled) for the 40 there."""
    from support.conformance import least_budget

    a, b = problem(shape, np.float64, seed=5)
    x = least_budget(lambda memory: bl.solve(ldexp(a, -450), ldexp(b, 550), lam=float(np.ldexp(1.0, -450)),
                                             memory=memory))
    assert x.report["gram"] == "out of core"
    expect = ldexp(np.asarray(bl.solve(a, b, lam=1.0)), 1000)
    cond = 1 + np.linalg.norm(a, 2) ** 2
    bound = 2 * 8 * max(shape) * np.finfo(float).eps * cond * fro_norm(expect)
    assert np.isfinite(bound) and fro_norm(np.asarray(x) - expect) <= bound


@pytest.mark.parametrize("shape", [(300, 64), (64, 300)], ids=["tall", "wide"])
def test_stored_gram_subnormal_x_warns(shape):
    """The stored-Gram route's ``x`` near ``2^-1050``: answered (to the smallest subnormal), with the warning. The
    wide route had refused it (its dual ``y`` near ``2^-1500`` below the range): it solves for ``2^-e x`` now."""
    from support.conformance import least_budget

    a, b = problem(shape, np.float64, seed=5)
    with pytest.warns(BlocklinWarning, match="x is subnormal"):
        x = least_budget(lambda memory: bl.solve(ldexp(a, 450), ldexp(b, -600), lam=float(np.ldexp(1.0, 450)),
                                                 memory=memory))
    assert x.report["gram"] == "out of core"
    assert_rescaled(np.asarray(x), a, b, -1050)


def test_tall_columns_far_apart_resumed(tmp_path, monkeypatch):
    """A run interrupted after its Gram pass resumes from the recorded sums with the powers of two each column was
    scaled by (recorded beside them): the rerun's ``x`` is bit for bit the uninterrupted run's. Had the per-column
    powers not been recorded, the resumed sums (scaled per column) would be scaled back by the one power."""
    import blocklin.linalg.solve.normal as normal

    a, b = problem((40, 6), np.float64, seed=3)
    bl.from_array(a, tmp_path / "A.zarr")
    bl.from_array(ldexp(b, np.array([600, -600])[None, :]), tmp_path / "B.zarr")
    args = (str(tmp_path / "A.zarr"), str(tmp_path / "B.zarr"))
    ref = np.asarray(bl.solve(*args, lam=1.0, refine=1, out=str(tmp_path / "ref.zarr")))

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(normal, "_run_residual_pass", interrupted)
    with pytest.raises(KeyboardInterrupt):
        bl.solve(*args, lam=1.0, refine=1, out=str(tmp_path / "x.zarr"), resume=True)
    monkeypatch.undo()
    x = bl.solve(*args, lam=1.0, refine=1, out=str(tmp_path / "x.zarr"), resume=True)
    assert "gram-pass" in x.report["resumed_passes"]
    np.testing.assert_array_equal(np.asarray(x), ref)


@pytest.mark.parametrize("q", [(600, -600), (0, -600), (0, 600)], ids=["2^1200 apart", "2^600 below", "2^600 above"])
@pytest.mark.parametrize("shape", [(300, 64), (64, 300)], ids=["tall", "wide"])
def test_stored_gram_columns_far_apart(shape, q):
    """Columns of ``b`` far apart on the stored-Gram route (a Gram over the budget), which scaled all of ``b`` by one
    power of two, its largest entry's: columns ``2^1200`` apart had been refused naming ``b`` (before that, the
    small column flushed to 0 and refused after the factorization as an ``x`` below the range), and a column
    ``2^600`` below one near 1 had its norms reported as 0. Each column is divided by its own power now (a float64
    copy of ``b``): ``x``, ``residual_norm`` and ``solution_norm`` per column are ``2^q_j`` times those of the
    column solved alone (in memory), within the module docstring's bound for both solves, with this ``A``'s
    ``cond(K) <= 1 + sigma_1^2`` (as ``test_stored_gram_x_near_the_top_of_the_range``); the residual's within
    ``||A||_F`` times that plus the rounding of ``b - A x``, ``c m eps (||b_j|| + ||A||_F ||x_j||)``."""
    from support.conformance import least_budget

    a, b = problem(shape, np.float64, seed=5)
    q = np.array(q)
    x = least_budget(lambda memory: bl.solve(a, ldexp(b, q[None, :]), lam=1.0, memory=memory))
    assert x.report["gram"] == "out of core"
    cond = 1 + np.linalg.norm(a, 2) ** 2
    c, big, eps = 8, max(shape), np.finfo(float).eps
    for j in range(2):
        ref = bl.solve(a, b[:, j:j + 1], lam=1.0)
        want = np.asarray(ref)[:, 0]
        dx = 2 * c * big * eps * cond * np.linalg.norm(want)
        assert np.linalg.norm(ldexp(np.asarray(x)[:, j], -int(q[j])) - want) <= dx, j
        assert abs(np.ldexp(x.report["solution_norm"][j], -int(q[j])) - ref.report["solution_norm"]) <= dx, j
        dr = fro_norm(a) * dx + 2 * c * big * eps * (np.linalg.norm(b[:, j]) + fro_norm(a) * np.linalg.norm(want))
        assert abs(np.ldexp(x.report["residual_norm"][j], -int(q[j])) - ref.report["residual_norm"]) <= dr, j


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_report_norms_of_columns_far_apart(route):
    """Columns of ``b`` near 1 and near ``2^-600``: the one power (here none, ``b``'s largest entry is near 1) keeps
    both, but the small column's squares (``2^-1200``) underflow, and its ``residual_norm`` and ``solution_norm``
    were reported as 0 (``x`` itself right). Such a column is scaled by its own power now (``exponent_b`` lists
    them) and its norms are ``2^-600`` times the unscaled column's, to the rounding of two solves: ``2 * 8 n eps
    cond(K)`` relative for ``x`` (module docstring, ``cond(K) < 40``), and for the residual that times
    ``1 + ||A|| ||x|| / ||r||`` (``r = b - A x``, ``||A||`` bounded by its Frobenius norm)."""
    shape, kw = ROUTES[route]
    a, b = problem(shape, np.float64, seed=6)
    e = np.array([0, -600])
    x = bl.solve(a, ldexp(b, e[None, :]), lam=1.0, **kw)
    assert x.report["scaling"]["exponent_b"] == [int(np.frexp(np.abs(b[:, j]).max())[1]) + int(e[j]) for j in range(2)]
    rel = 2 * 8 * max(shape) * np.finfo(float).eps * 40
    for j in range(2):
        alone = bl.solve(a, b[:, j:j + 1], lam=1.0, **kw).report
        xn, rn = alone["solution_norm"], alone["residual_norm"]
        assert abs(np.ldexp(x.report["solution_norm"][j], -int(e[j])) - xn) <= rel * xn, j
        amp = 1 + np.linalg.norm(a) * xn / rn
        assert abs(np.ldexp(x.report["residual_norm"][j], -int(e[j])) - rn) <= rel * amp * rn, j
