"""Orthonormalizing tall blocks: in core when they fit, else out-of-core CholeskyQR2.

A tall block ``Y`` (``M x c``, ``c`` small) is orthonormalized through its R factor, ``Q = Y R^{-1}``:

* in core (the block fits the budget): Householder QR (LAPACK);
* out of core: CholeskyQR2 (Fukaya, Nakatsukasa, Yanagisawa, Yamamoto 2014). The Gram matrix
  ``G = Y^T Y`` is usually accumulated for free by the pass that produced ``Y``; ``R1 = chol(G)``,
  then one pass over ``Y`` forms ``G2 = (Y R1^{-1})^T (Y R1^{-1})`` and ``R = chol(G2) R1``. This is
  as accurate as Householder QR when ``cond(Y) < eps^{-1/2}``. When ``chol(G)`` breaks down (the block
  is more ill-conditioned), the shifted CholeskyQR3 of Fukaya, Kannan, Nakatsukasa, Yamamoto,
  Yanagisawa (SIAM J. Sci. Comput. 2020) adds a shift ``s = 11 (M c + c (c + 1)) u ||G||`` and one more
  refinement pass; if that fails too, a streaming TSQR pass (Householder per strip, Demmel et al. 2012)
  gives ``R`` unconditionally.

Complex blocks take the same steps with conjugate transposes (``G = Y^H Y``, Hermitian Cholesky,
``Q^H Q = I``) in complex128, LAPACK's conventions; every in-memory factor is float64 for real data,
complex128 for complex (:func:`work_dtype`).

All out-of-core work runs as engine row passes over a :class:`~blocklin.linalg.blocks.tallblock.TallBlock`
(:func:`blocklin.runtime.passes.run_pass`) whose products go through the device.
"""

from __future__ import annotations

import math
from typing import Any, Unpack

import numpy as np
import scipy.linalg

from blocklin.config import Settings
from blocklin.errors import ShapeError, explain
from blocklin.linalg.blocks.random import STREAM_FILL, gaussian
from blocklin.linalg.blocks.tallblock import TallBlock
from blocklin.linalg.blocks.tsqr import diagonal_signs, signed_columns


# -- in-core helpers ---------------------------------------------------------------------------
def work_dtype(dtype: Any) -> np.dtype:
    """The precision of the in-memory steps: float64, or complex128 for complex data."""
    return np.dtype(np.complex128 if np.dtype(dtype).kind == "c" else np.float64)


def ct(x: np.ndarray) -> np.ndarray:
    """The conjugate transpose ``x^H`` (``x^T`` of real data, a view: no copy)."""
    return x.conj().T


def orth_incore(x: np.ndarray) -> np.ndarray:
    """Orthonormal basis of the columns of ``x`` (Householder QR, float64 or complex128)."""
    q, _ = np.linalg.qr(np.asarray(x, dtype=work_dtype(x.dtype)))
    return q


def orth_against(v: np.ndarray | None, x: np.ndarray, *, seed: int = 0, counter: int = 0,
                 drop: float = 1e-10, width: int | None = None) -> np.ndarray:
    """Orthonormal basis of ``(I - V V^H) x`` (block Gram-Schmidt twice, then an SVD).

    Directions that are numerically in ``span(V)`` (relative norm below ``drop``) are replaced by
    random directions (counter-based: ``(seed, counter)``), so the result always has ``x``'s width, or
    ``width`` columns when given: the ``width`` dominant directions of the projected ``x`` (its leading
    left singular vectors), the rest never orthonormalized or filled.
    """
    x = np.asarray(x, dtype=work_dtype(x.dtype))
    n, b = x.shape
    avail = n - (v.shape[1] if v is not None else 0)
    b = min(b, avail)
    if b <= 0:
        return np.zeros((n, 0), dtype=x.dtype)
    x = x[:, :b] if x.shape[1] > b else x
    keep = b if width is None else max(0, min(width, b))
    scale = np.linalg.norm(x, axis=0).max() or 1.0

    def project(y: np.ndarray, owned: bool) -> np.ndarray:
        # in place once the block is this function's own: two n x c blocks alive, not three
        if v is None or v.shape[1] == 0:
            return y
        for _ in range(2):
            p = v @ (ct(v) @ y)
            if owned:
                y -= p
            else:
                y, owned = y - p, True
            del p
        return y

    y = project(x, owned=False)
    if keep < b:
        q = _leading_directions(y, keep, drop * scale)
    else:
        # y's SVD from its R factor (y = Q_y R, U = Q_y U_R): a tall QR at a Gram product's rate, not LAPACK's
        # tall SVD (10^5 x 28: 25 ms against 76 ms)
        qy, r = tall_qr(y)
        ur, s, _ = np.linalg.svd(r)
        q = qy @ ur[:, np.flatnonzero(s > drop * scale)[:keep]]
        del qy
    del y
    if q.shape[1] < keep:  # breakdown: fill with random directions orthogonal to V and q
        fill = gaussian(seed, STREAM_FILL, counter * n, (counter + 1) * n, keep - q.shape[1], x.dtype)
        for basis in ((v, q) if v is not None else (q,)):
            for _ in range(2):
                fill -= basis @ (ct(basis) @ fill)
        qf, _ = np.linalg.qr(fill)
        q = np.hstack([q, qf])
    q = project(q, owned=True)  # one more pass against V after normalization (keeps V q at eps)
    return tall_qr(q)[0]


def _leading_directions(y: np.ndarray, keep: int, floor: float) -> np.ndarray:
    """Up to ``keep`` leading left singular vectors of ``y`` (``n x b``, ``keep < b``) whose singular values
    exceed ``floor``, from the eigenvectors of ``y^H y``: ``u_i = y w_i / s_i``.

    The Gram matrix resolves a singular value ``s_i`` to about ``u s_1^2 / s_i`` (its rounding), so only
    those above ``sqrt(64 b eps) s_1`` count: the caller fills the rest with random directions and
    orthonormalizes them all again. A handful of leading directions of an ill-conditioned block (the
    residual vectors of a Lanczos run's Ritz pairs: ``cond`` near ``10^7``) then take one Gram product
    where a tall QR of every column fell back to Householder's (48 ms of a 1.2 s sparse svd at ``10^5``
    rows)."""
    g = ct(y) @ y
    lam, w = np.linalg.eigh((g + ct(g)) / 2)
    lam, w = lam[::-1], w[:, ::-1]
    top = max(float(lam[0]), 0.0) if lam.size else 0.0
    sv = np.sqrt(np.maximum(lam, 0.0))
    good = np.flatnonzero((sv > floor) & (lam > 64 * y.shape[1] * np.finfo(np.float64).eps * top))[:keep]
    return (y @ w[:, good]) / sv[good]


#: Condition number of a tall block under which :func:`tall_qr` takes CholeskyQR2 (orthogonal to about
#: ``u`` while ``cond < u^-1/2``, about 7e7 in float64: Yamamoto et al. 2015), with a margin.
CHOLQR_COND = 1e6


def tall_qr(y: np.ndarray, g: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Reduced ``Y = Q R`` of a tall in-memory block (float64 or complex128; ``R``'s diagonal of any sign);
    ``g``: ``Y^H Y`` where the caller formed it already (its first Gram product).

    CholeskyQR2 (Fukaya, Nakatsukasa, Yanagisawa, Yamamoto 2014): two Gram products and two
    ``c x c`` Cholesky factors, at the rate of a matrix product, where ``chol(Y^H Y)`` exists and
    ``cond(R) < CHOLQR_COND``; else Householder QR (LAPACK) on one BLAS thread (its panels are
    matrix-vector work, which threads only slow down on a busy machine: a ``10^5 x 30`` block took
    1.1 s on two threads under load).
    """
    r1 = cholesky_upper(ct(y) @ y if g is None else g)
    if r1 is not None and np.linalg.cond(r1) < CHOLQR_COND:
        q = y @ _inv_upper(r1)
        r2 = cholesky_upper(ct(q) @ q)
        if r2 is not None:
            return q @ _inv_upper(r2), r2 @ r1
    from blocklin._blas import blas_threads

    with blas_threads(1):
        return np.linalg.qr(y)


def reorthogonalize(v: Any, y: np.ndarray, c: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """A block Lanczos step's projection of its block ``y`` against the whole basis ``V`` (a Lanczos
    basis: :class:`~blocklin.linalg.lowrank.basis.Basis`), given ``c = V^H y`` and ``g = y^H y`` from the
    read that formed ``y``; returns ``(y, y^H y)``, ``y`` projected in place and its Gram matrix (``None``
    where a third pass changed ``y`` after it was formed).

    ``y`` is the step's image already projected against the blocks it couples with in exact arithmetic
    (the three-term block recurrence); rounding leaves it components along the rest of ``V``, which one
    classical Gram-Schmidt pass ``y - V c`` removes to working precision unless it took most of ``y``
    ("twice is enough", Parlett, *The Symmetric Eigenvalue Problem*, 1998, sec. 6-9; Giraud, Langou,
    Rozloznik 2005 for blocks): that pass is repeated where some direction of ``y`` lost more than
    ``1 / sqrt(2)`` of its norm to it, the smallest eigenvalue of the pencil ``(y_2^H y_2, g)`` below
    ``1/2`` (or ``g`` singular: a direction lost whole). The pass forms ``y_2^H y_2`` in its own read
    (:meth:`Basis.subtract_gram`); the rare repeat reads ``V`` twice (:meth:`Basis.project_out`)."""
    y, g2 = v.subtract_gram(y, c)
    try:
        lost = float(scipy.linalg.eigh(g2, g, eigvals_only=True, check_finite=False)[0]) < 0.5
    except (np.linalg.LinAlgError, ValueError):  # g not positive definite: a direction of y was lost
        lost = True
    if lost:
        v.project_out(y)
        return y, None
    return y, g2


def next_block(v: np.ndarray, q1: np.ndarray, t: np.ndarray, *, norm_z: float, seed: int, counter: int,
               width: int, drop: float = 1e-10, projected: bool = False) -> np.ndarray:
    """Orthonormal basis of the ``width`` dominant directions of ``y = Q1 T``, the block ``z`` once
    projected against an orthonormal ``V`` (``y = z - V (V^H z)``, ``Q1 T`` its Householder QR), kept
    orthogonal to ``V`` (block Lanczos's next block). ``V`` is an array or a Lanczos basis (its
    ``shape`` and ``project_out``: :mod:`blocklin.linalg.lowrank.basis`, in memory or spilled).

    The directions are ``Q1 U_T`` from the SVD of the small ``T`` (those below ``drop`` times the
    largest column of ``y`` replaced by random ones, counter-based ``(seed, counter)``, orthogonal to
    ``V`` and the rest). One projection leaves components in ``span(V)`` of about ``u ||z||``, grown by
    ``||z|| / s_min`` when normalized; the Kahan-Parlett test ("twice is enough", Parlett, *The
    Symmetric Eigenvalue Problem*, 1998, sec. 6-9) projects again only where that growth exceeds
    ``sqrt(2)`` (``norm_z`` is ``||z||_2``), and a third time where the second projection still lost
    more than that (Giraud, Langou, Rozloznik 2005 for the block form). ``projected``: ``y`` already had
    those passes (:func:`reorthogonalize`), so only random fill directions are projected again.
    """
    n = q1.shape[0]
    avail = n - (v.shape[1] if v is not None else 0)
    keep = max(0, min(width, avail, n))
    if keep == 0:
        return np.zeros((n, 0), dtype=q1.dtype)
    u, s, _ = scipy.linalg.svd(t, check_finite=False)  # c x c
    scale = float(np.linalg.norm(t, axis=0).max(initial=0.0)) or 1.0
    good = np.flatnonzero(s > drop * scale)[:keep]
    q = q1 @ u[:, good]
    smin = float(s[good].min()) if good.size else 0.0
    fill = keep - q.shape[1]
    if fill:  # breakdown: random directions orthogonal to V and q
        g = gaussian(seed, STREAM_FILL, counter * n, (counter + 1) * n, fill, q1.dtype)
        for basis in ((v, q) if v is not None else (q,)):
            for _ in range(2):
                _project_out(basis, g)
        qf, _ = np.linalg.qr(g)
        q = np.hstack([q, qf])
    if v is None or v.shape[1] == 0:
        return q
    lost = fill > 0 or (not projected and smin * math.sqrt(2.0) < norm_z)
    for _ in range(2):
        if not lost:
            break
        _project_out(v, q)
        q, r = tall_qr(q)
        lost = float(np.abs(np.diag(r)).min(initial=1.0)) * math.sqrt(2.0) < 1.0
    return q


def _project_out(v: Any, q: np.ndarray) -> None:
    """``q -= V (V^H q)`` in place; ``V`` an array, or a Lanczos basis that projects strip by strip
    (:class:`blocklin.linalg.lowrank.basis.Basis`, in memory or spilled to disk)."""
    if isinstance(v, np.ndarray):
        q -= v @ (ct(v) @ q)
    else:
        v.project_out(q)


def cholesky_upper(g: np.ndarray) -> np.ndarray | None:
    """Upper Cholesky factor of a symmetric ``g`` (float64; Hermitian complex128, ``g = R^H R``), or None
    when it is not positive definite."""
    try:
        r = scipy.linalg.cholesky((g + ct(g)) / 2, lower=False, check_finite=False)
    except np.linalg.LinAlgError:
        return None
    d = np.abs(np.diag(r))
    if not np.all(np.isfinite(r)) or d.min(initial=1.0) <= 1e-300 or d.max(initial=0.0) > 1e300:
        return None
    return r


def shift_for(g: np.ndarray, m: int) -> float:
    """Shift of shifted CholeskyQR: ``11 (m c + c (c + 1)) u ||G||_2`` (Fukaya et al. 2020)."""
    c = g.shape[0]
    u = np.finfo(np.float64).eps / 2
    return 11.0 * (m * c + c * (c + 1)) * u * float(np.linalg.norm(g, 2))


def refine_once(block: Any, r: np.ndarray, chain: list) -> tuple[np.ndarray, list]:
    """One more CholeskyQR step on ``Q = Y chain`` (one pass over the stored block for ``Q^T Q``): the
    orthogonality CholeskyQR2 leaves, ``O(kappa^2 eps)`` near ``kappa(Y) ~ eps^-1/2`` (Yamamoto et al.
    2015), brought back to ``O(eps)``; ``(r, chain)`` unchanged where ``chol(Q^T Q)`` breaks down."""
    ri = cholesky_upper(block.gram_after(chain))
    if ri is None:
        return r, chain
    return ri @ r, [*chain, _inv_upper(ri)]


def _inv_upper(r: np.ndarray) -> np.ndarray:
    return scipy.linalg.solve_triangular(r, np.eye(r.shape[0]), lower=False)


def cholqr_r(block: Any, g: np.ndarray, *, rank_revealing: bool = False) -> tuple[np.ndarray, list, dict, Any]:
    """R factor of a stored tall block whose Gram matrix ``g`` is known.

    Returns ``(R, chain, info, base)``: ``Q = base chain[0] chain[1] ...`` (applied in sequence) has
    orthonormal columns and ``Y = Q R``. ``base`` is ``block`` itself, or where the first factor was
    settled (:func:`_settle`: a stored ``Y`` beyond :data:`SETTLE_CONDITION`) the stored ``Y F_1``, which
    every later pass reads instead of ``Y``. CholeskyQR2 (one refinement pass); shifted CholeskyQR3 when
    ``chol(G)`` breaks down (two refinement passes); TSQR then two CholeskyQR refinements as the last resort.

    ``rank_revealing``: when ``chol(G)`` breaks down go to TSQR at once (one pass) and return
    ``Q = Y W S^+`` from the SVD ``R = U_R S W^T`` (zero columns for the numerically zero singular
    values, whose ``R`` rows are zero) instead of a shifted factorization that would blur them to
    ``sqrt(u)``. The SVD form, not ``Y R^-1``, for every such ``R``: a product with ``W S^+`` rounds each
    column ``j`` by ``eps ||Y|| / s_j``, which ``S W^H`` scales back to ``eps ||Y||``, so ``Q R = Y`` holds to
    the TSQR's backward error whatever ``Y``'s condition; ``Y R^-1`` in ``Y``'s dtype carries
    ``eps kappa(Y) ||Y||``, which the refinements folded into ``R`` (a float32 ``Y`` of condition 1e16 whose
    ``R``'s diagonal did not show it had given a largest singular value 1e6 times too large).
    """
    g = np.asarray(g, dtype=work_dtype(g.dtype))
    info = {"method": "cholqr2", "shift": 0.0}
    refinements = 1
    r1 = cholesky_upper(g)
    if r1 is not None and rank_revealing and _beyond_cholqr(r1):
        r1 = None  # a Cholesky that went through by rounding: its Q would not be orthonormal
    if r1 is None and not rank_revealing:
        sh = shift_for(g, block.M)
        info.update(method="shifted-cholqr3", shift=sh)
        r1 = cholesky_upper(g + sh * np.eye(g.shape[0]))
        refinements = 2
    if r1 is None:
        info["method"] = "tsqr"
        r1 = block.tsqr()
        refinements = 2
        if rank_revealing or _numerically_singular(r1, block):
            return _rank_deficient(r1, block, info)
    block, chain, g1 = _settle(block, [_inv_upper(r1)], info, condition=_condition(r1))
    r = r1
    for i in range(refinements):
        gi = g1 if i == 0 and g1 is not None else block.gram_after(chain)
        ri = cholesky_upper(gi)
        if ri is None:
            ri = cholesky_upper(gi + shift_for(gi, block.M) * np.eye(gi.shape[0]))
        if ri is None:
            break
        chain.append(_inv_upper(ri))
        r = ri @ r
    chain = chain or [np.eye(r.shape[0], dtype=r.dtype)]
    d = diagonal_signs(r)
    chain[-1] = signed_columns(chain[-1], d)
    return d[:, None] * r, chain, info, block


#: The condition of ``Y``'s first factor ``F_1`` beyond which a stored ``Y`` has ``Y F_1`` written once
#: (:func:`_settle`). Below it, recomputing ``Y F_1`` in each pass differs by ``kappa u``, within the
#: ``O(c u)`` orthogonality CholeskyQR2 gives anyway.
SETTLE_CONDITION = 1e2


def _settle(block: Any, chain: list, info: dict, *, condition: float) -> tuple[Any, list, np.ndarray | None]:
    """``(base, chain, G)``: the first factor of ``chain`` applied once and written, where it matters.

    CholeskyQR2's analysis takes ``Q_1 = Y F_1`` as one computed matrix: ``G_2 = Q_1^H Q_1`` and the final
    ``Q = Q_1 F_2`` must use the same bits. A stored ``Y`` recomputes ``Y F_1`` in each pass, and BLAS rounds
    a product of a few rows differently from one of many (OpenBLAS's small-matrix kernels), so strips of
    other heights give a ``Q_1`` that differs by ``kappa(Y) u``, which ``F_2`` then does not correct:
    ``U`` orthonormal only to 3e-10..8e-6 for ``kappa(Y)`` of 1e8..1e30, while the residuals, computed
    from ``R``, said 1e-15 (``svd(method="full")`` at 1-4x its least budget, found by a randomized search).
    So ``Y F_1`` is written in one pass with its Gram matrix (the same bits), and the refinements and the
    final product read it: one more write of ``Y``'s size, no more reads. In-memory blocks recompute the
    same bits every time and are left as they are."""
    settled = getattr(block, "settled", None)
    if settled is None or not condition > SETTLE_CONDITION:
        return block, chain, None
    base, g = settled(chain[0])
    info["settled"] = True
    return base, chain[1:], g


def _condition(r: np.ndarray) -> float:
    """LAPACK's estimate of an upper triangular ``R``'s condition (``trcon``, 1-norm); inf when singular."""
    from scipy.linalg import lapack

    if r.size == 0:
        return 1.0
    trcon = lapack.get_lapack_funcs("trcon", (r,))
    rc, info = trcon(r, norm="1", uplo="U", diag="N")
    return math.inf if info != 0 or not rc > 0.0 else 1.0 / float(rc)


#: The condition of ``Y`` beyond which a rank-revealing :func:`cholqr_r` takes TSQR though ``chol(Y^T Y)``
#: went through: CholeskyQR2's first ``Q`` is off by ``kappa^2 u``, which its second step corrects while
#: that is well below 1 (Yamamoto et al. 2015). A ``Y`` of a numerical zero (a centered ``A``) or of
#: condition 1e8 had passed ``chol`` by rounding at some budgets and given a ``U`` off by 1e-10 to 2e-2
#: (found by a randomized search).
CHOLQR_MAX_CONDITION = 1e7


def _beyond_cholqr(r: np.ndarray) -> bool:
    """LAPACK's estimate of ``R``'s condition above :data:`CHOLQR_MAX_CONDITION`."""
    return not _condition(r) < CHOLQR_MAX_CONDITION


def _numerically_singular(r: np.ndarray, block: Any) -> bool:
    """``R`` (from Householder QR) has a diagonal entry at the rounding level of ``Y``'s dtype."""
    d = np.abs(np.diag(r))
    eps = float(np.finfo(np.dtype(getattr(block, "dtype", np.float64))).eps)
    return bool(d.size and (d.max() == 0.0 or d.min() <= eps * math.sqrt(block.M) * d.max()))


#: CholeskyQR steps on the kept columns of a rank-deficient ``Y``'s basis (:func:`_rank_deficient`).
RANK_DEFICIENT_REFINEMENTS = 2


def _rank_deficient(r: np.ndarray, block: Any, info: dict) -> tuple[np.ndarray, list, dict, Any]:
    """``Y`` of numerical rank ``rho < c`` (a matrix of rank below the block width, the zero matrix):
    ``R = U_R S W^H`` and ``Q = Y W S^+``, whose columns are orthonormal for the ``rho`` nonzero singular
    values and zero for the others, with ``Y = Q (S W^H)`` to rounding (``Y W`` vanishes where ``S`` does).
    Then :data:`RANK_DEFICIENT_REFINEMENTS` CholeskyQR steps on the ``rho`` columns (a pass each): ``Y W
    S^+`` alone is orthonormal only to ``eps`` times the kept part's condition, which the cut allows up to
    ``1 / (eps sqrt(M))``, so a stored ``Y W S^+`` is written once (:func:`_settle`)."""
    ur, sv, wt = np.linalg.svd(r)
    eps = float(np.finfo(np.dtype(getattr(block, "dtype", np.float64))).eps)
    keep = sv > eps * math.sqrt(block.M) * sv.max(initial=0.0)
    sinv = np.where(keep, 1.0 / np.where(keep, sv, 1.0), 0.0)
    rank = int(keep.sum())
    info.update(method="tsqr (rank-deficient)" if rank < keep.size else "tsqr", rank=rank)
    rr, first = np.where(keep, sv, 0.0)[:, None] * wt, ct(wt) * sinv
    kept = sv[keep]
    block, chain, g = _settle(block, [first], info, condition=float(kept.max() / kept.min()) if kept.size else 1.0)
    # Y W S^+ is orthonormal only to eps times the kept part's condition, up to 1 / sqrt(M) at the cut
    # (a graded Y: 1e-2, measured); CholeskyQR steps on the kept columns bring it to eps, as in cholqr_r
    for i in range(RANK_DEFICIENT_REFINEMENTS):
        gi = g if i == 0 and g is not None else block.gram_after(chain)
        ri = cholesky_upper(gi[np.ix_(keep, keep)])
        if ri is None:
            break
        step = np.zeros_like(first)
        step[np.ix_(keep, keep)] = _inv_upper(ri)
        rr[keep] = ri @ rr[keep]
        chain.append(step)
    return rr, chain or [np.diag(keep.astype(first.dtype))], info, block


def svd_of_r(r: np.ndarray, *, lapack_driver: str = "gesdd") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``R = U_R S W^H`` of the ``R`` factor of :func:`cholqr_r` (square), taken on ``R``'s nonzero rows only.

    A rank-deficient ``Y`` leaves zero rows in ``R`` and zero columns in ``Q`` (:func:`_rank_deficient`).
    The exact ``U_R`` vanishes on those rows, but LAPACK's singular vectors are accurate only to
    ``eps ||R|| / gap`` (Wedin, "Perturbation bounds in connection with singular value decomposition", BIT
    12, 1972; Golub and Van Loan, Matrix Computations, 4th ed., Sec. 8.6): a singular value near the
    rounding cut ``eps sqrt(M) s_1`` puts weight up to ``1e-2`` on them, which the zero columns of ``Q``
    then drop, so that ``U = Q U_R`` lost its orthonormality (``||U^H U - I||`` of 1e-8 to 6e-3 on graded
    matrices, found by a randomized search). On the nonzero rows ``U_R`` is exactly zero elsewhere and ``U = Q U_R`` is orthonormal to
    working precision (the identity on the zero rows makes ``U_R`` unitary; their singular values are 0).
    The same exact-support argument is why the Rayleigh-Ritz step of Halko, Martinsson and Tropp (2011,
    Alg. 5.1) forms ``U`` from an orthonormal basis times the small factor's vectors."""
    def decompose(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if lapack_driver == "gesdd":  # NumPy's, as the callers took it
            return np.linalg.svd(x)
        return scipy.linalg.svd(x, lapack_driver=lapack_driver, check_finite=False)

    live = np.any(r != 0, axis=1)
    if live.all() or r.size == 0:
        return decompose(r)
    rows = np.flatnonzero(live)
    c, n = r.shape
    ul, sl, wt = decompose(r[rows])
    u = np.zeros((c, c), dtype=ul.dtype)
    u[np.ix_(rows, np.arange(rows.size))] = ul
    dead = np.flatnonzero(~live)
    u[dead, rows.size + np.arange(dead.size)] = 1.0
    return u, np.concatenate([sl, np.zeros(min(c, n) - sl.size)]), wt


# -- public ------------------------------------------------------------------------------------------
def orthonormalize(y: Any, out: Any = None, *, overwrite: bool = False,
                   **settings: Unpack[Settings]) -> tuple[Any, np.ndarray]:
    """Orthonormalize the columns of a tall matrix: ``Y = Q R``.

    In core (Householder QR) when ``Y`` fits the budget, else out of core with CholeskyQR2, a shifted
    CholeskyQR3 when the Gram matrix is numerically singular, and streaming TSQR as the last resort
    (see the module docstring).

    Parameters
    ----------
    y : path, zarr array, Matrix, NumPy or Dask array
        A tall ``M x c`` matrix, ``M >= c``.
    out : path, optional
        Where to write ``Q``; a temporary store (that you own) when omitted.
    overwrite : bool
        Replace an existing ``out``.
    **settings
        As for every operation: :class:`~blocklin.config.Settings`.

    Returns
    -------
    Q : Matrix
        ``M x c`` with orthonormal columns, in ``Y``'s dtype, with ``.report`` (``orth``: the method).
    R : ndarray
        ``c x c`` upper triangular, positive diagonal, float64.
    """
    from blocklin.runtime.job import Job
    from blocklin.storage import write_array

    with Job("orth", **settings) as job:
        Y = job.operand(y, "y")
        M, c = Y.shape
        if M < c:
            raise ShapeError(explain("y", "must be tall (rows >= columns)", f"{M} x {c}",
                                     "orthonormalize the transpose"))
        blk = TallBlock(job, Y.path, M, c, Y.dtype, Y.chunks[0], job.cfg.memory)
        ao = job.claim(out, [Y], overwrite=overwrite)
        if 3 * M * c * 8 <= job.cfg.memory:  # in core: Householder QR of the block read once
            q, r = _householder(job, blk.apply_to([np.eye(c)], None, collect=True, description="orthonormalize: read"))
            d = diagonal_signs(r)
            write_array(ao.array_path(), np.ascontiguousarray(signed_columns(q, d).astype(Y.dtype)))
            r, info = d[:, None] * r, {"method": "householder (in core)", "shift": 0.0}
            phases = {"read Y": "cpu", "Householder QR": job.device}
        else:
            r, chain, info, blk = cholqr_r(blk, blk.gram_after([np.eye(c)]))
            blk.apply_to(chain, ao.array_path(), description="orthonormalize: write Q")
            phases = {"passes over Y": job.device}
        report = job.report(orth=info, intermediate_passes=job.passes("intermediate"), phases=phases)
        return job.finish(ao, out, report, operation="orthonormalize", params={"method": info["method"]},
                          keys=REPORT_KEYS), r


def _householder(job: Any, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reduced Householder QR of an in-memory block, on the job's device (cuSOLVER on a GPU)."""
    if job.device != "gpu":
        return np.linalg.qr(x)
    from blocklin.device import get_device

    dev = get_device("gpu", device_memory=job.device_memory())
    with dev.reserve(3 * x.nbytes):  # the block, Q and cuSOLVER's work, from the GPU's shared budget
        q, r = dev.qr(dev.to_device(x))
        return np.asarray(dev.to_host(q)), np.asarray(dev.to_host(r))


#: Report entries recorded in the output's attributes.
REPORT_KEYS = ("seconds", "bytes_read", "bytes_logical", "bytes_written", "peak_memory", "passes", "device", "scheduler", "orth")
