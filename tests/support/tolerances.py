"""Norm-wise error bounds for comparing computed results with references, derived, never tuned.

Every bound here is a worst-case rounding-error bound from the standard analysis (Higham, *Accuracy
and Stability of Numerical Algorithms*, 2nd ed., 2002), written with ``eps = np.finfo(dtype).eps``
of the dtype the computation ran in (``u = eps / 2`` is the unit roundoff). They hold for every
summation order, so a blocked or tiled engine, another BLAS kernel (``OPENBLAS_CORETYPE``) or
another thread count cannot break them; a test that fails one by a lot has found a real error, not
rounding. Element-wise relative checks with ``atol=0`` do not have that property: a small entry
(an off-diagonal of a Gram matrix, a near-cancelling dot product) carries the absolute error of the
large ones, so its relative error is unbounded.

Each ``assert_*`` compares a result with a reference that is itself computed in floating point, so
the constant ``c`` covers two roundings of the same quantity (ours and the reference's) unless said
otherwise. Norms are Frobenius (it bounds the 2-norm, and ``|| |A| |B| ||_F <= ||A||_F ||B||_F``
makes the component-wise bounds norm-wise). The failure message states the error, the bound and
their ratio, so a failure says how far off a result is.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "eps", "product_bound", "assert_product", "assert_gram", "assert_residual", "assert_solve",
    "assert_factorization", "assert_singular_values", "assert_ritz_values", "assert_eigenvalues", "assert_orthonormal",
    "assert_spectral_norms",
    "assert_mean", "assert_std", "assert_explained_variance", "assert_close_to", "fro_norm",
]


def eps(dtype) -> float:
    """Machine epsilon of the dtype a computation ran in (``2 u``, u the unit roundoff; of a complex
    dtype, that of its real and imaginary parts)."""
    return float(np.finfo(np.dtype(dtype)).eps)


def _f64(x) -> np.ndarray:
    """``x`` in float64, or complex128 for complex data (never its real part alone)."""
    return np.asarray(x, dtype=np.complex128 if np.iscomplexobj(x) else np.float64)


def fro_norm(x) -> float:
    """Frobenius norm, scaled by the power of two of max|x| first (exactly): NumPy's sum of squares
    overflows to Inf for entries beyond about 1e154, which would make a bound built from it Inf and
    its check vacuous."""
    x = _f64(x)
    m = float(np.max(np.abs(x))) if x.size else 0.0
    if m == 0.0 or not np.isfinite(m):
        return float(np.linalg.norm(x))
    e = int(np.frexp(m)[1])
    h = -e // 2  # in two factors: 2^-e alone is beyond the range for a subnormal max|x| (e below -1023)
    return float(np.ldexp(np.linalg.norm(x * np.ldexp(1.0, h) * np.ldexp(1.0, -e - h)), e))


def _dtype(got, dtype):
    return np.dtype(dtype) if dtype is not None else np.asarray(got).dtype


def _check(what: str, err: float, bound: float) -> None:
    assert np.isfinite(err) and err <= bound, (
        f"{what}: error {err:.3e} exceeds the bound {bound:.3e} (ratio {err / bound if bound else np.inf:.3g})")


def product_bound(a, b, dtype, *, const: float = 2.0, alpha: float = 1.0) -> float:
    """Bound on ``||fl(alpha A B) - alpha A B||_F``, for either of two computations.

    ``|fl(AB) - AB| <= gamma_k |A| |B|`` entry-wise for any summation order (Higham, Thm 3.5 and
    §3.5), ``gamma_k = k u / (1 - k u)``; taking Frobenius norms, ``<= gamma_k ||A||_F ||B||_F``.
    Two such results differ by at most ``2 gamma_k ~ k eps``: ``const = 2`` leaves one ``k eps`` for
    the scaling by alpha, the ``beta C`` update and the accumulation of tile products into a stored
    output in the output dtype (each one more rounding of an entry no larger than the sum's bound).
    """
    k = np.shape(a)[-1] if np.ndim(a) > 1 else np.size(a)
    return const * max(k, 1) * eps(dtype) * abs(alpha) * fro_norm(a) * fro_norm(b)


def assert_product(got, ref, a, b, *, dtype=None, alpha: float = 1.0, const: float = 2.0, extra: float = 0.0) -> None:
    """``||C - C_ref||_F <= c k eps |alpha| ||A||_F ||B||_F (+ extra)``, k the inner dimension of ``A @ B``.

    ``a`` and ``b`` are the operands as multiplied (already transposed); ``extra`` is a further
    absolute term a caller derives for an addend (``c eps ||beta C||_F`` for ``+ beta C``).
    """
    bound = product_bound(a, b, _dtype(got, dtype), const=const, alpha=alpha) + extra
    _check(f"product of inner dimension {np.shape(a)[-1]}", fro_norm(_f64(got) - _f64(ref)), bound)


def assert_gram(got, ref, a, *, dtype=None, trans: bool = False, alpha: float = 1.0, const: float = 2.0,
                extra: float = 0.0) -> None:
    """Gram (SYRK) ``alpha A^T A`` (or ``alpha A A^T`` with ``trans``): the product bound with ``B = A^T``.

    ``||G - G_ref||_F <= c k eps |alpha| ||A||_F^2`` with k the number of products summed per entry
    (the rows of A for ``A^T A``, its columns for ``A A^T``); SYRK's half-triangle and mirroring are
    exact, so the same ``c = 2`` as for a product. ``extra``: as for :func:`assert_product`.
    """
    a = _f64(a)
    k = a.shape[1] if trans else a.shape[0]
    bound = const * max(k, 1) * eps(_dtype(got, dtype)) * abs(alpha) * fro_norm(a) ** 2 + extra
    _check(f"Gram of inner dimension {k}", fro_norm(_f64(got) - _f64(ref)), bound)


def assert_residual(a, x, b, *, dtype=None, const: float = 4.0) -> None:
    """Backward error of a solve: ``||A x - b||_F <= c n eps ||A||_F ||x||_F``.

    A backward-stable solve returns the exact solution of ``(A + E) x = b`` with
    ``||E|| <= p(n) eps ||A||`` (LU with partial pivoting: ``gamma_{3n}`` times the growth factor,
    Higham Thm 9.4; Cholesky and Householder QR: ``gamma_{cn}``, Thm 10.4, 19.5), so
    ``||A x - b|| = ||E x|| <= p(n) eps ||A|| ||x||``. ``c = 4`` covers ``3n`` and the rounding of
    forming the residual itself (a product of inner dimension n, ``gamma_n``). n is the columns of A
    (the unknowns). ``dtype`` is the dtype the solution is accurate to (float64 for a solve refined to
    float64 backward error, whatever it factored in).
    """
    a64, x64 = _f64(a), _f64(x)
    n = a64.shape[1]
    r = a64 @ x64.reshape(n, -1) - _f64(b).reshape(a64.shape[0], -1)
    bound = const * n * eps(_dtype(x, dtype)) * fro_norm(a64) * fro_norm(x64)
    _check(f"backward error of an order-{n} solve", fro_norm(r), bound)


def assert_solve(got, ref, a, *, dtype=None, const: float = 8.0, cond: float | None = None) -> None:
    """Forward error of a solve against a reference solution, from the condition number.

    A backward error ``||E|| <= 4 n eps ||A||`` (:func:`assert_residual`) moves x by at most
    ``kappa(A) ||E|| / ||A||`` relative (Higham Thm 7.2, first order), so
    ``||x - x_ref|| / ||x_ref|| <= 4 n eps kappa(A)`` for each of the two solutions: ``c = 8``.
    ``a`` is the matrix of the system solved (the regularized normal matrix for a Tikhonov solve,
    whose condition number bounds that of the stacked least-squares matrix's squared); ``cond``
    gives ``kappa_2`` directly when the caller knows it.
    """
    a64 = _f64(a)
    kappa = float(np.linalg.cond(a64)) if cond is None else float(cond)
    n = a64.shape[1]
    bound = const * n * eps(_dtype(got, dtype)) * kappa * fro_norm(ref)
    _check(f"forward error of an order-{n} solve (cond {kappa:.3g})", fro_norm(_f64(got) - _f64(ref)), bound)


def assert_factorization(a, product, *, factors=(), dtype=None, const: float = 2.0) -> None:
    """Residual of a factorization: ``||A - F_1 F_2 ...||_F <= c n eps ||A||_F`` (or ``||F_1||_F ||F_2||_F``).

    Tiled LU and Cholesky satisfy ``|A - L U| <= gamma_n |L| |U|`` in any order of the updates
    (Higham Thm 9.3, 10.3), Householder QR ``||A - Q R|| <= gamma_{cn} ||A||`` (Thm 19.4), so with
    ``factors=(L, U)`` the bound uses ``||L||_F ||U||_F`` (which carries LU's growth factor) and
    otherwise ``||A||_F``. ``c = 2``: the factorization's ``gamma_n`` plus forming the product for
    the check (another ``gamma_n``). n is the columns of A.
    """
    a64 = _f64(a)
    n = a64.shape[1]
    scale = float(np.prod([fro_norm(f) for f in factors])) if factors else fro_norm(a64)
    bound = const * n * eps(_dtype(product, dtype)) * scale
    _check(f"residual of an order-{n} factorization", fro_norm(a64 - _f64(product)), bound)


def assert_singular_values(got, ref, *, n: int, dtype=None, const: float = 4.0, gram: bool = False,
                           s1: float | None = None) -> None:
    """Singular values against a reference: Weyl, ``|s_i - s_ref_i| <= c n eps s_1``.

    A backward-stable SVD (or a projection onto an orthonormal basis that captures the spectrum)
    returns the exact singular values of ``A + E`` with ``||E||_2 <= p(n) eps ||A||_2``, and Weyl's
    inequality moves each value by at most ``||E||_2`` (Higham §3.1; Golub & Van Loan Cor. 8.6.2):
    ``c = 4`` is two such computations, each a reduction of order n (the larger dimension summed:
    the rows streamed) plus the product of the computed basis with A. With ``gram=True`` the values
    are ``sqrt(eig(A^T A))``: the Gram matrix carries ``||E|| <= 2 n eps s_1^2`` (product bound),
    Weyl moves ``s_i^2`` by that much, and ``s_i - s_ref_i = (s_i^2 - s_ref_i^2) / (s_i + s_ref_i)``:
    small values lose relative accuracy as ``s_1^2 / s_i``, as the Gram route must.
    """
    s = _f64(got).ravel()
    r = _f64(ref).ravel()
    assert s.shape == r.shape, f"{s.shape} singular values, reference has {r.shape}"
    top = float(np.max(np.abs(r))) if s1 is None else float(s1)
    e = eps(_dtype(got, dtype))
    if gram:
        bound = const * n * e * top ** 2 / np.maximum(s + r, np.finfo(np.float64).tiny)
    else:
        bound = np.full(s.shape, const * n * e * top)
    err = np.abs(s - r)
    worst = int(np.argmax(err / bound)) if s.size else 0
    _check(f"singular value {worst} of {s.size} (order {n}{', Gram route' if gram else ''})",
           float(err[worst]) if s.size else 0.0, float(bound[worst]) if s.size else 1.0)


def assert_ritz_values(got, ref, *, spectrum, residuals, n: int, norm: float, dtype=None,
                       const: float = 4.0) -> None:
    """Converged Rayleigh-Ritz values (eigenvalues or singular values) against exact ones.

    A Ritz value whose (unit) Ritz vector has residual ``r`` lies within ``||r||^2 / gap`` of an exact
    value, gap its distance to the rest of the spectrum (Kato-Temple; Parlett, *The Symmetric
    Eigenvalue Problem*, Thm 11.7.1; for singular triplets the same on the Jordan-Wielandt matrix),
    plus the rounding of the products that formed it (Weyl, as :func:`assert_singular_values`).
    ``spectrum`` is the whole reference spectrum (for the gaps), ``residuals`` the absolute residual
    norms the iteration reached (its tolerance times the value when it reports only that).
    """
    w, r = _f64(got).ravel(), _f64(ref).ravel()
    full = np.sort(_f64(spectrum).ravel())
    gaps = np.array([np.min(np.abs(np.delete(full, np.argmin(np.abs(full - x))) - x), initial=np.inf) for x in r])
    res = np.broadcast_to(_f64(residuals), w.shape)
    bound = res ** 2 / gaps + const * n * eps(_dtype(got, dtype)) * float(norm)
    err = np.abs(w - r)
    i = int(np.argmax(err / bound))
    _check(f"Ritz value {i} of {w.size} (residual {res[i]:.3g}, gap {gaps[i]:.3g})", float(err[i]), float(bound[i]))


def assert_eigenvalues(got, ref, *, norm: float, n: int, dtype=None, const: float = 4.0) -> None:
    """Symmetric eigenvalues against a reference: Weyl, ``|w_i - w_ref_i| <= c n eps ||A||_2``.

    The same argument as :func:`assert_singular_values` for a symmetric operator of 2-norm ``norm``.
    """
    w, r = _f64(got).ravel(), _f64(ref).ravel()
    assert w.shape == r.shape, f"{w.shape} eigenvalues, reference has {r.shape}"
    _check(f"eigenvalues (order {n})", float(np.max(np.abs(w - r), initial=0.0)),
           const * n * eps(_dtype(got, dtype)) * float(norm))


def assert_spectral_norms(norm, cond, a, s, *, rows: int, **kw) -> None:
    """``norm(a, 2)``, ``norm(a, -2)``, ``norm(a, "nuc")`` and ``cond(a)`` (blocklin's, called with ``kw``) of a
    float64 ``a`` of ``rows`` rows and known singular values ``s`` (descending).

    Each computed singular value moves by at most ``4 rows eps s_1`` (Weyl; the SVD's backward error, as
    :func:`assert_singular_values`), the nuclear norm by the sum of ``n`` such moves, ``cond`` by the first
    order of both ends; the 2-norm by block Lanczos to a residual ``r = 10 sqrt(eps) s_1`` moves by
    ``r^2 / (s_1^2 - s_2^2) s_1`` more (Kato-Temple).
    """
    e = eps(np.float64)
    s1, n = float(s[0]), len(s)
    r = 10 * np.sqrt(e) * s1
    _check("norm(a, 2)", abs(norm(a, 2, **kw) - s1), r ** 2 / (s1 ** 2 - float(s[1]) ** 2) * s1 + 4 * rows * e * s1)
    _check("norm(a, -2)", abs(norm(a, -2, **kw) - float(s[-1])), 4 * rows * e * s1)
    _check("norm(a, 'nuc')", abs(norm(a, "nuc", **kw) - float(np.sum(s))), n * 4 * rows * e * s1)
    kappa = s1 / float(s[-1])
    _check("cond(a)", abs(cond(a, **kw) - kappa), 4 * rows * e * (1 + kappa) * kappa)


def assert_orthonormal(q, *, dtype=None, const: float = 2.0, n: int | None = None) -> None:
    """``||Q^T Q - I||_F <= c n eps``, n the rows of Q (``Q^H Q`` of complex Q).

    Householder QR's computed Q is orthonormal to ``gamma_{cn}`` (Higham Thm 19.4), Gram-Schmidt
    with reorthogonalization likewise; forming ``Q^T Q`` adds ``gamma_n ||Q||_F^2`` with
    ``||Q||_F^2 = k`` columns: the bound is ``c n eps`` per unit column, ``c = 2`` (factor and check),
    times ``sqrt(k)`` for the Frobenius norm of the k x k difference.
    """
    q64 = _f64(q)
    rows, k = q64.shape
    n = rows if n is None else n
    bound = const * n * eps(_dtype(q, dtype)) * np.sqrt(k)
    _check(f"orthonormality of {k} columns of length {rows}", fro_norm(q64.conj().T @ q64 - np.eye(k)), bound)


def assert_mean(got, x, *, axis: int = 0, dtype=None, const: float = 2.0) -> None:
    """Column means: ``|mu_j - mu_ref_j| <= c m eps mean_i |x_ij|`` for each column j.

    A sum of m terms in any order is off by at most ``gamma_{m-1} sum |x_i|`` (Higham §4.2), and
    dividing by m adds one rounding: ``c = 2`` for two computations.
    """
    x64 = _f64(x)
    m = x64.shape[axis]
    ref = x64.mean(axis=axis)
    bound = const * m * eps(_dtype(got, dtype)) * np.abs(x64).mean(axis=axis)
    err = np.abs(_f64(got) - ref)
    j = int(np.argmax(err - bound))
    _check(f"mean of column {j} ({m} values)", float(err[j]), float(bound[j]))


def assert_std(got, x, *, axis: int = 0, ddof: int = 0, dtype=None, const: float = 2.0) -> None:
    """Column standard deviations, from the condition number of the variance.

    Any of the stable variance algorithms (two-pass, Welford/Chan-Golub-LeVeque updates, pairwise
    merges) computes the sum of squared deviations S to a relative error of at most ``m eps kappa^2``
    with ``kappa^2 = ||x||^2 / S`` its condition number (Chan, Golub & LeVeque 1983, Table 1, the
    largest of the stable methods' bounds); a square root halves a relative error. So
    ``|sd - sd_ref| <= c m eps kappa^2 sd / 2`` with ``c = 2`` for two computations.
    """
    x64 = _f64(x)
    m = x64.shape[axis]
    ref = x64.std(axis=axis, ddof=ddof)
    dev = x64 - x64.mean(axis=axis, keepdims=True)
    s = np.maximum((dev ** 2).sum(axis=axis), np.finfo(np.float64).tiny)
    kappa2 = (x64 ** 2).sum(axis=axis) / s
    bound = const * m * eps(_dtype(got, dtype)) * kappa2 * ref / 2
    err = np.abs(_f64(got) - ref)
    j = int(np.argmax(err - bound))
    _check(f"standard deviation of column {j} ({m} values, kappa^2 {kappa2[j]:.3g})", float(err[j]), float(bound[j]))


def assert_close_to(got, ref, *, bound: float, what: str) -> None:
    """``||got - ref||_F <= bound`` for a bound the caller derived (and states next to the call)."""
    _check(what, fro_norm(_f64(got) - _f64(ref)), bound)


def assert_explained_variance(ev, ev_ref, ratio, ratio_ref, a, *, dtype=None, const: float = 4.0) -> None:
    """PCA's explained variances ``s_i^2 / (m - 1)`` and their ratios to the total variance.

    The centered products are rounded at the size of the data with its means (``||A||_2`` of the
    uncentered A, see :func:`assert_singular_values` with ``s1``), so ``|s_i - s_ref_i| <= b`` with
    ``b = c m eps ||A||_2`` and ``|ev_i - ev_ref_i| <= (2 s_i + b) b / (m - 1)``. The total variance
    ``||A - 1 mu^T||_F^2 / (m - 1)`` is a sum of m squares per column after a cancellation against
    the means: off by at most ``c m eps ||A||_F^2 / (m - 1)``; a ratio carries both relative errors.
    """
    a64 = _f64(a)
    m = a64.shape[0]
    e = eps(_dtype(ev, dtype))
    b = const * m * e * float(np.linalg.norm(a64, 2))
    s = np.sqrt(_f64(ev_ref) * (m - 1))
    ev_bound = (2 * s + b) * b / (m - 1)
    err = np.abs(_f64(ev) - _f64(ev_ref))
    i = int(np.argmax(err / ev_bound))
    _check(f"explained variance {i}", float(err[i]), float(ev_bound[i]))
    total = float(np.sum(a64.var(axis=0, ddof=1)))
    t_bound = const * m * e * fro_norm(a64) ** 2 / (m - 1)
    r_bound = ev_bound / total + _f64(ratio_ref) * t_bound / total
    err = np.abs(_f64(ratio) - _f64(ratio_ref))
    i = int(np.argmax(err / r_bound))
    _check(f"explained variance ratio {i}", float(err[i]), float(r_bound[i]))
