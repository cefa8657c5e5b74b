"""The SVD's methods on a source of ``B`` (:class:`~blocklin.linalg.lowrank.sources.Source`): randomized
subspace iteration (``rsvd``), the single-pass sketch, block Lanczos, the Gram route, the whole space
(``full``: every triplet, or the smallest), and the streaming QR route (``tsqr``) where ``B^T B`` cannot
hold ``B``. Each returns a :class:`Factorization`; every one but the sketch ends with the same
Rayleigh-Ritz pass (:func:`rayleigh_ritz`, :func:`whole_space`), which writes the long factor.

Complex ``B`` takes the same steps with conjugate transposes (``B = U diag(s) V^H``, ``B^H B``), its
small factors in complex128; the sources and the tall-block passes conjugate where they must.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import numpy as np
import scipy.linalg

from blocklin.linalg.blocks import random as rnd
from blocklin.linalg.blocks.complete import complete_incore, complete_stored, keep_spanned
from blocklin.linalg.blocks.center import Moments
from blocklin.linalg.blocks.orth import (cholqr_r, ct, orth_against, orth_incore, refine_once, svd_of_r,
                                        work_dtype)
from blocklin.linalg.blocks.scaling import squares_lose_columns
from blocklin.linalg.blocks.tallblock import ArrayBlock, TallBlock
from blocklin.linalg.lowrank.lanczos import block_lanczos, small_blas, start_block
from blocklin.linalg.lowrank.sources import Source
from blocklin.linalg.lowrank.svd_tolerance import default_tol
from blocklin.linalg.lowrank.triplets import (enrich_width, numerically_zero, resolution_floor, rounding_level,
                                              triplet_report, triplet_scale)
from blocklin.linalg.lowrank.updatable import sketch_state
from blocklin.plan.svd import SvdPlan
from blocklin.runtime.checkpoints import Checkpoints


@dataclasses.dataclass(frozen=True, eq=False)
class Factorization:
    """The truncated SVD of ``B`` (or of ``B_c``, centered and/or scaled) as a method leaves it, with what
    the run adds (:func:`blocklin.linalg.lowrank.run.run_planned`); :func:`blocklin.svd` turns it into
    its result and report. The optional fields are ``None`` where the method has nothing to say."""

    s: np.ndarray  # the k singular values, descending
    V: np.ndarray  # N x k: the right singular vectors of B (V for tall A, U for wide A)
    residuals: np.ndarray | None  # per triplet ||B^T u - s v|| (None: the single-pass sketch never checks)
    orth: dict | str  # how Y was orthonormalized (blocklin.linalg.blocks.orth.cholqr_r), or "tsqr"
    long: Any = None  # what writing the long factor returned (None when it went to its array)
    power_iters: int | None = None  # rsvd: the power iterations made
    history: list | None = None  # rsvd, lanczos: the worst triplet's convergence measure after each pass
    lanczos_steps: int | None = None  # lanczos, gram (0 where the Gram's subspace sufficed)
    restarts: int | None = None  # lanczos: thick restarts
    rayleigh_ritz_width: int | None = None  # lanczos: Ritz vectors and residual directions of the final step
    sketch_size: list | None = None  # sketch: [k + oversample, 2 (k + oversample) + 1]
    sketch_generator: int | None = None  # sketch: the version of its test matrices' generator (blocks/random)
    fallback: str | None = None  # why the method gave way to the streaming QR route
    phases: dict | None = None  # where the reads and products ran (cpu, gpu)
    means_fused: bool = False  # the column means came from the first pass of the method
    scaling: dict | None = None  # the power of two of the data (blocklin.linalg.blocks.scaling), None if none
    moments: Moments | None = None  # the column means and variances, centered or scaled
    mean: np.ndarray | None = None  # the column means subtracted (center)
    scale: np.ndarray | None = None  # the column standard deviations divided by (scale)
    scaled_moments: tuple[Moments, int] | None = None  # (moments of 2^-e A, e) when the data was scaled
    note: dict | None = None  # lanczos: why converged triplets may be wrong (lanczos.full_block_cluster)
    remeasured: int | None = None  # triplets whose residual one more pass over a streamed A measured (remeasured)
    values_exponent: int = 0  # within svd.scaled_values: the power of two s and residuals were not multiplied by


def ritz_relative_residuals(q: np.ndarray, z: np.ndarray, k: int, dtype: Any) -> np.ndarray:
    """Per triplet ``||B^T B v - s^2 v|| / (s max(s, sqrt(eps) s_1))`` for the top ``k`` Ritz pairs of ``span(q)``."""
    h = ct(q) @ z
    theta, y = np.linalg.eigh((h + ct(h)) / 2)
    theta, y = theta[::-1][:k], y[:, ::-1][:, :k]
    sig = np.sqrt(np.maximum(theta, 0))
    r = np.linalg.norm(z @ y - (q @ y) * theta, axis=0)
    scale = triplet_scale(sig, dtype)
    return r / scale / scale


def rayleigh_ritz(src: Source, Q: np.ndarray, k: int, dest: str | None, transposed_out: bool,
                  label: str, seed: int = 0, tol: float | None = None) -> Factorization:
    """The final pass shared by every method but the sketch: ``Y = B Q`` (stored, with ``Y^T Y`` and
    ``Z = B^T Y``), ``Y = Q_Y R`` by CholeskyQR2, ``R = U_R S W^T``; writes ``U = Q_Y U_R``, returns
    ``s``, ``V = Q W`` and the exact residuals ``||B^T u - s v||`` (``B v - s u = 0`` by construction).

    The singular values come from ``R`` (a factor of ``B Q``), not from the eigenvalues of ``B^T B``,
    so they are accurate to ``eps s_1`` down to zero (a rank-deficient ``A`` gives zeros, whose columns
    of ``U`` are completed from ``seed``: :func:`write_long`). ``tol``: what the triplets are judged
    against (:func:`remeasured`)."""
    Zf, G, Y = src.normal(Q, keep_y=True, gram=True, description=f"{label}: final projection")
    # Y in memory (an operator's products): its QR, chain and long factor are the in-memory work of
    # small_blas, which two BLAS threads only slowed on a busy machine (1.2 s against 0.08 s for a 10^5 x 28 Y)
    with small_blas(Y.M, Y.c) if isinstance(Y, ArrayBlock) else contextlib.nullcontext():
        return write_long(*project(src, Q, k, Zf, G, Y, tol), dest, transposed_out, label, signs=src.signs, seed=seed)


def project(src: Source, Q: np.ndarray, k: int, Zf: np.ndarray, G: np.ndarray,
            Y: Any, tol: float | None = None) -> tuple[Factorization, Any, list]:
    """The Rayleigh-Ritz step of :func:`rayleigh_ritz` from its pass's ``Z = B^T B Q``, ``Y^T Y`` and ``Y``:
    the factorization without its long factor, ``Y`` and the chain that makes ``U`` of it."""
    R, chain, orth_info, Y = cholqr_r(Y, G, rank_revealing=True)
    with small_blas(R.shape[0], R.shape[1]):
        Ur, S, Vrt = svd_of_r(R)
    # singular values at the rounding level of B Q are zeros of A (rank < k): exactly 0, their U columns
    # completed as the long factor is written (write_long); relative to ||A|| itself when a streamed pass
    # centers A after its products (see blocklin.linalg.blocks.center)
    ref = max(float(S[0]) if S.size else 0.0, src.noise_scale)
    zero = numerically_zero(S[:k], ref, src.dtype, src.M)
    sig = np.where(zero, 0.0, S[:k])
    Ur = Ur[:, :k]  # a zero's column too: write_long keeps it where range(Q_Y) holds it (keep_spanned)
    Vr = ct(Vrt)[:, :k]
    V = Q @ Vr
    safe = np.where(sig > 0, sig, 1.0)
    # a completed u is orthogonal to range(B Q), which holds range(B) here: B^T u - 0 v = 0 to rounding
    resid = np.where(zero, 0.0, np.linalg.norm(Zf @ Vr / safe - V * sig, axis=0))
    resid, again = remeasured(src, Y, chain + [Ur], V, sig, resid, tol)
    return Factorization(s=sig, V=V, residuals=resid, orth=orth_info, remeasured=again), Y, chain + [Ur]


#: How far above its own rounding a residual measured through ``B^H B`` must be to be taken as it is
#: (:func:`remeasured`); nearer, it is measured again from ``B^H u``.
SQUARED_ROUNDING_MARGIN = 100.0


def remeasured(src: Source, Y: Any, chain: list, V: np.ndarray, sig: np.ndarray, resid: np.ndarray,
               tol: float | None = None) -> tuple[np.ndarray, int | None]:
    """The residuals ``||B^H u - s v||`` of the triplets whose measure through ``B^H B`` is mostly its own
    rounding, measured again from ``B^H u`` (one product with those columns), and how many were
    measured again by a pass over a streamed ``A`` (``None``: no such pass).

    :func:`project` measures ``B^H u = B^H (B v) / s``: ``Z = B^H B Q`` is rounded at ``eps sqrt(M) s_1^2``,
    so the residual of a triplet far below ``s_1`` carries ``eps sqrt(M) s_1^2 / s`` (a value at
    ``6e-15 s_1``: ``0.4 s_1``, where the true residual is ``1e-15 s_1``), and accurate triplets read as
    unconverged (every such run warned). Where the measure is within :data:`SQUARED_ROUNDING_MARGIN` of
    that bound and above the direct product's rounding ``eps sqrt(M) s_1``, ``u = Q_Y U_R`` is formed (as it
    is written) and ``B^H u`` taken directly, rounded at ``eps sqrt(M) s_1`` (products with ``B`` itself keep
    the small singular values that ``B^H B`` loses below ``sqrt(eps) s_1``: Golub and Van Loan, Matrix
    Computations, 4th ed., Sec. 8.6; the rounding levels as in
    :func:`~blocklin.linalg.lowrank.triplets.numerically_zero`).

    A streamed ``B`` takes that product as one more pass over ``A`` (:meth:`~blocklin.linalg.lowrank.sources.
    Streamed.rmat`, ``u`` held in memory) for the triplets in doubt that miss ``tol`` on the measure they
    have (so the passes of data whose triplets converge are unchanged; a graded ``3000 x 40`` matrix, ``s`` from
    1 to ``1e-12``, had reported relative residuals of 0.1-0.8 for triplets whose own were ``1e-9``, all
    unconverged with a warning), and where the pass plans within the budget beside ``u``; a centered or
    scaled ``B`` keeps its measure (the centering is applied inside the passes of ``B^H B``)."""
    from blocklin.linalg.lowrank.sources import InCore

    if not sig.size:
        return resid, None
    incore = isinstance(src, InCore)
    s1 = float(sig.max())
    level = rounding_level(src.dtype, src.M) * s1
    safe = np.where(sig > 0, sig, 1.0)
    doubt = (sig > 0) & (resid > 10 * level) & (resid <= SQUARED_ROUNDING_MARGIN * level * s1 / safe)
    if not incore:  # a pass over A, u held beside it: only the triplets in doubt that miss tol as they stand
        doubt &= resid / triplet_scale(sig, src.dtype) > (tol if tol is not None else 0.0) * (1 + 1e-9)
        if getattr(src, "shift", None) is not None or not hasattr(src, "rmat"):
            return resid, None
    if not doubt.any():
        return resid, None
    ws = [*chain[:-1], chain[-1][:, doubt]]
    u = np.asarray(Y.apply_to(ws, None) if incore or isinstance(Y, ArrayBlock) else
                   Y.apply_to(ws, None, collect=True, description="the long factor's columns in doubt"))
    u = u.astype(src.dtype, copy=False)
    if incore:
        z = np.conj(src.b.T @ np.conj(u)) if u.dtype.kind == "c" else src.b.T @ u  # B^H u, no conjugated copy of B
    else:
        z = src.rmat(u, description="svd: the residuals of the triplets in doubt, from B^H u")
        if z is None:  # the pass does not plan within the budget beside u: the measure stands
            return resid, None
    out = resid.copy()
    out[doubt] = np.linalg.norm(np.asarray(z).astype(V.dtype) - V[:, doubt] * sig[doubt], axis=0)
    return out, None if incore else int(doubt.sum())


def judged_tol(tol: float | None, dtype: Any) -> float:
    """The tolerance the report judges the triplets of ``rsvd`` against: ``tol``, or without one the
    Lanczos SVD's default (:func:`~blocklin.linalg.lowrank.svd_tolerance.default_tol`, as the report takes it)."""
    return tol if tol is not None else default_tol(dtype)


def component_signs(V: np.ndarray) -> np.ndarray:
    """scikit-learn's sign rule (``svd_flip`` on the components, >= 1.5): ``d_i = +-1`` making the entry
    of largest magnitude of column ``i`` of ``V`` positive (``+1`` for a zero column).

    Complex ``V``: the phase ``d_i = conj(v_ji) / |v_ji|`` of that entry, which makes it real and positive
    (the complex SVD's convention: each triplet is unique up to a unit-modulus factor, applied to ``u`` and
    ``v`` alike; the first of equal moduli, as ``argmax`` takes it)."""
    if V.size == 0:
        return np.ones(V.shape[1], dtype=V.dtype if V.dtype.kind == "c" else np.float64)
    big = np.argmax(np.abs(V), axis=0)
    d = np.sign(V[big, np.arange(V.shape[1])])  # of complex data z / |z|
    if d.dtype.kind == "c":
        return np.where(d == 0, 1.0, d.conj())
    return np.where(d == 0, 1.0, d)


def write_long(f: Factorization, Y: Any, chain: list, dest: str | None, transposed_out: bool,
               label: str, *, signs: bool = False, seed: int = 0) -> Factorization:
    """Write the long factor ``U = Q_Y U_R`` of a Rayleigh-Ritz step (``Q_Y = Y chain[:-1]``: CholeskyQR2
    applied in sequence, orthonormal to working precision, zero columns where ``Y`` is rank-deficient;
    ``U_R = chain[-1]``). ``dest=None``: the caller wants no long factor (``return_singular_vectors``), so
    nothing is written and no pass is made. ``signs``: each triplet's sign (of complex data, phase) chosen
    by :func:`component_signs` on ``V`` (PCA's components), applied to ``U`` as it is written
    (``A = U diag(s) V^H`` is unchanged).

    The columns of zero singular values (``f.s == 0``: the methods report a numerically zero value as
    ``0``, :func:`~blocklin.linalg.lowrank.triplets.numerically_zero`) are the method's own where
    ``range(Q_Y)`` holds them (:func:`~blocklin.linalg.blocks.complete.keep_spanned`: a square or nearly
    square ``A``), else an orthonormal completion, orthogonal to ``Q_Y`` and to each other, from the
    normal rows of ``seed`` (:mod:`blocklin.linalg.blocks.complete`): ``U^T U = I`` as LAPACK's and
    ``svds``' factors."""
    if signs:
        d = component_signs(f.V)
        f = dataclasses.replace(f, V=f.V * d)
        chain = [*chain[:-1], chain[-1] * d]
    if dest is None:
        return f
    what = f"{label}: write the long factor"
    zero = np.asarray(f.s) == 0
    if zero.any():  # those range(Q) holds are the method's own; the others are completed
        chain, zero = keep_spanned(Y, chain, zero)
    if not zero.any():
        return dataclasses.replace(f, long=Y.apply_to(chain, dest, transposed_out=transposed_out, description=what))
    basis = chain[:-1]
    if isinstance(Y, TallBlock):
        complete_stored(Y, basis, chain[-1], zero, seed, dest, transposed_out=transposed_out, description=what)
        return f
    from blocklin.storage import write_array

    q = Y.apply_to(basis or [np.eye(Y.c, dtype=work_dtype(Y.dtype))], None)  # in memory (on the host from a device)
    u = complete_incore(np.asarray(q), chain[-1], zero, seed).astype(q.dtype)
    write_array(dest, np.ascontiguousarray(u.T if transposed_out else u))
    return f


def picked(count: int, k: int, which: str) -> np.ndarray:
    """Indices of the wanted ``k`` of ``count`` descending singular values: the first (``"LM"``, largest)
    or the last (``"SM"``, smallest), kept in descending order."""
    return np.arange(k) if which == "LM" else np.arange(count - k, count)


def whole_space(src: Source, k: int, which: str, dest: str | None, transposed_out: bool,
                seed: int = 0, basis: np.ndarray | None = None, label: str = "full") -> Factorization:
    """Every singular triplet of ``B`` (or the ``k`` largest or smallest): the Rayleigh-Ritz step over the
    whole space, ``Q = I`` (or ``basis``, any orthonormal ``N x N`` one: the Gram route's eigenvectors of
    ``B^T B``, which make the columns of ``B Q`` near orthogonal, so the CholeskyQR below is taken of a
    matrix that is ill-conditioned only by the scale of its columns; the result is ``Q``'s rotation of
    the one with ``Q = I``). One pass stores ``Y = B Q`` with its Gram matrix; ``Y = Q_Y R`` (CholeskyQR2 and
    a third step, :func:`~blocklin.linalg.blocks.orth.refine_once`, since ``B`` may be as ill-conditioned
    as its smallest triplets; rank-revealing TSQR where ``chol(Y^T Y)`` breaks down:
    :func:`blocklin.linalg.blocks.orth.cholqr_r`),
    ``R = U_R S V^T`` by LAPACK in memory, and ``U = Q_Y U_R`` is written.

    This is how LAPACK's ``xGESVD`` treats a tall matrix (a QR first, then the SVD of ``R``; Chan,
    "An improved algorithm for computing the singular value decomposition", ACM TOMS 8(1), 1982), so
    the singular values carry its backward error: within a small multiple of ``eps ||B||_2`` of the
    exact ones, the smallest included (those at the rounding level, ``eps sqrt(M) s_1``, come out as
    zeros, with an orthonormal completion as their columns of ``U``: :func:`write_long`). ``U`` is
    orthonormal to working precision whatever ``B``'s condition, as ``Q_Y`` and ``U_R`` are. The residuals are those of ``R``'s SVD,
    ``||R^T u_R - s v||`` (``B^T u - s v`` differs from it by the factorization's backward error): the
    products ``B^T B v / s`` the other methods measure carry ``eps ||B||^2 / s``, which says nothing
    about a small triplet."""
    N = src.N
    eye = np.eye(N, dtype=work_dtype(src.dtype)) if basis is None else basis
    _, G, Y = src.normal(eye, keep_y=True, gram=True, description=f"{label}: B{'' if basis is None else ' Q'} "
                         "and its Gram matrix")
    R, chain, orth_info, Y = cholqr_r(Y, G, rank_revealing=True)
    del G
    if orth_info["method"] == "cholqr2":  # B's condition may reach eps^-1/2 here: a third step keeps U orthonormal
        R, chain = refine_once(Y, R, chain)
        orth_info = orth_info | {"method": "cholqr3"}
    with small_blas(N, N):
        Ur, S, Vrt = svd_of_r(R, lapack_driver="gesvd")
    idx = picked(N, k, which)
    Ur, sig, Vr = Ur[:, idx], S[idx], ct(Vrt[idx])
    resid = np.linalg.norm(ct(R) @ Ur - Vr * sig, axis=0)  # Q orthonormal: the same norms in B's coordinates
    V = np.ascontiguousarray(Vr if basis is None else basis @ Vr)
    sig = np.where(numerically_zero(sig, float(S[0]) if S.size else 0.0, src.dtype, src.M), 0.0, sig)
    f = Factorization(s=sig, V=V, residuals=resid, orth=orth_info)
    return write_long(f, Y, chain + [Ur], dest, transposed_out, label, signs=src.signs, seed=seed)


def rsvd_start(n: int, l: int, seed: int, v0: np.ndarray | None = None, dtype: Any = np.float64) -> np.ndarray:
    """The orthonormal random block randomized subspace iteration starts from (``v0`` its first column;
    complex Gaussian for complex ``dtype``)."""
    g = rnd.gaussian(seed, rnd.STREAM_OMEGA, 0, n, l, work_dtype(dtype))
    if v0 is not None:
        g[:, 0] = v0
    return orth_incore(g)


def rsvd(src: Source, k: int, l: int, q: int | None, tol: float | None, seed: int, max_passes: int,
         dest: str | None, transposed_out: bool, ckpt: Checkpoints, v0: np.ndarray | None = None) -> Factorization:
    """Randomized subspace iteration (Halko, Martinsson, Tropp 2011, Alg. 4.4): ``q`` power iterations of
    ``l`` columns, or with ``q=None`` until every Ritz triplet reaches ``tol``; then :func:`rayleigh_ritz`."""
    saved = ckpt.load("rsvd")
    if saved is None:
        Q = rsvd_start(src.N, l, seed, v0, src.dtype)
        used, history, done = 0, [], False
    else:  # resume: the block after the last completed power iteration, bit for bit
        Q, used, done = saved["Q"], int(saved["used"]), bool(saved["done"])
        history = [float(h) for h in np.atleast_1d(saved["history"])]
    total = q if q is not None else max_passes - 1
    while not done and used < total:
        Z, _, _ = src.normal(Q, description=f"rsvd: power iteration {used + 1}" + (f"/{q}" if q is not None else ""))
        if q is None:  # adaptive: stop when every Ritz triplet's own relative residual reaches tol
            history.append(float(ritz_relative_residuals(Q, Z, k, src.dtype).max(initial=0.0)))
            done = history[-1] <= tol
        Q = orth_incore(Z)
        used += 1
        ckpt.save("rsvd", Q=Q, used=used, history=np.array(history, dtype=np.float64), done=done)
    f = rayleigh_ritz(src, Q, k, dest, transposed_out, "rsvd", seed, tol=judged_tol(tol, src.dtype))
    return dataclasses.replace(f, power_iters=used, history=history)


def psi_t(seed: int, s: int, P: np.ndarray, generator: int | None = None) -> np.ndarray:
    """``Psi^T P``, generating ``Psi`` a block of rows at a time (the numbers of the sketch's pass, from
    the same ``generator``; complex ``P``: the complex ``Psi`` of a complex sketch)."""
    gen = rnd.GaussianRows(seed, rnd.STREAM_SKETCH_PSI, s, complex=P.dtype.kind == "c", generator=generator)
    out = np.zeros((s, P.shape[1]), dtype=work_dtype(P.dtype))
    for r0 in range(0, P.shape[0], gen.block):
        r1 = min(P.shape[0], r0 + gen.block)
        out += gen.rows(r0, r1).T @ P[r0:r1]
    return out


def sketch(src: Source, k: int, kp: int, s: int, seed: int, dest: str | None,
           transposed_out: bool, keep: dict | None = None, y_path: Any = None) -> Factorization:
    """The single-pass sketch of Tropp, Yurtsever, Udell and Cevher (2019), "Streaming low-rank matrix
    approximation with an application to scientific simulation", SIAM J. Sci. Comput. 41(4): range
    sketch ``Y = B Omega``, co-range sketch ``X = Upsilon B`` and core sketch ``Z = Phi B Psi^T``
    from one pass; the test matrices are generated from the seed where they are used, by the current
    generator (:data:`blocklin.linalg.blocks.random.SKETCH_GENERATOR`, recorded in the result). Then
    :func:`sketch_finish`. ``keep``: filled with the sketch's state (sums over rows, float64) and
    ``y_path``: where ``Y`` is stored, for an updatable result (:mod:`blocklin.linalg.update.sketch`)."""
    state = list(src.sketch(kp, s, seed, y_path=y_path))
    if keep is not None:
        keep.update(sketch_state(*state[:3]))
    return sketch_finish(state, k=k, seed=seed, dest=dest, transposed_out=transposed_out, signs=src.signs)


def sketch_finish(state: list, *, k: int, seed: int, dest: str | None, transposed_out: bool,
                  signs: bool = False, generator: int | None = None) -> Factorization:
    """The single-pass sketch's factors from its state ``[X^T, Phi^T [Y T], G, Y]`` alone (Tropp et
    al. 2019, Alg. 7 with the orthonormalizations of ``Y`` and ``X^T``; the list is emptied, so that
    ``X^T`` is not held past its QR): ``Y = Q R`` by CholeskyQR from ``G = Y^T Y``,
    ``P = orth(X^T)``, the core ``C = (Phi Q)^+ Z ((Psi^T P)^+)^T`` by two least-squares solves,
    ``C = U_C S W^T``, ``V = P W`` and ``U = Q U_C`` written to ``dest`` (a pass over ``Y``, never over
    ``A``). A fixed function of ``(X^T, Phi^T [Y T], G, Y)``, the seed and the ``generator`` that
    made the state (``Psi`` is regenerated by it): the one-pass sketch and its update
    (:mod:`blocklin.linalg.update.sketch`) both end here.

    Complex data: ``B ~ Q C P^H`` and ``Z = Phi B Psi ~ (Phi Q) C (P^H Psi)``, so the second solve takes
    ``(P^H Psi)^T = Psi^T conj(P)``, and ``V = P W`` from ``C = U_C S W^H``."""
    Xt, PZ, G, Y = state
    state.clear()
    generator = rnd.check_generator(generator)  # None: the current one
    kp = Xt.shape[1]
    s = PZ.shape[0]
    PY, Z = PZ[:, :kp], PZ[:, kp:]
    R, chain, orth_info, Y = cholqr_r(Y, G, rank_revealing=True)
    rinv = np.linalg.pinv(R)  # R is singular when A has rank < k + oversample (zero rows of R: zero columns of Q)
    # the core on Q's nonzero columns only: least squares over Q's zero columns too put weight on them in
    # U_C, columns of U = Q U_C of norm 0.6 to 1 (a graded A, found by a randomized search)
    live = np.flatnonzero(np.any(R != 0, axis=1))
    P = orth_incore(Xt)
    del Xt
    phiq = (PY @ rinv)[:, live]
    psitp = psi_t(seed, s, P.conj(), generator)
    if live.size:
        c1 = scipy.linalg.lstsq(phiq, Z)[0]               # (Phi Q)^+ Z
        C = scipy.linalg.lstsq(psitp, c1.T)[0].T          # ... ((Psi^T P)^+)^T
        Ul, Sc, Vct = np.linalg.svd(C)
    else:  # A = 0: no core; every column of U completed, V any orthonormal basis of range(P)
        Ul, Sc, Vct = np.zeros((0, 0), dtype=phiq.dtype), np.zeros(0), np.eye(P.shape[1], dtype=P.dtype)
    Uc = np.zeros((R.shape[0], max(k, Ul.shape[1])), dtype=Ul.dtype)  # zero columns beyond the rank: completed
    Uc[live, :Ul.shape[1]] = Ul
    Sc = np.concatenate([Sc, np.zeros(max(0, k - Sc.size))])
    # C has rank at most Q's: values beyond it, and those at the rounding level, are zeros of A
    zero = numerically_zero(Sc[:k], float(Sc[0]) if Sc.size else 0.0, Y.dtype, Y.M)
    zero |= np.arange(k) >= int(orth_info.get("rank", kp))
    sig = np.where(zero, 0.0, Sc[:k])
    V = P @ ct(Vct)[:, :k]
    del P
    f = Factorization(s=sig, V=V, residuals=None, orth=orth_info, sketch_size=[kp, s],
                      sketch_generator=generator)
    return write_long(f, Y, chain + [Uc[:, :k]], dest, transposed_out, "sketch", signs=signs, seed=seed)


def lanczos(src: Source, k: int, plan: SvdPlan, tol: float, seed: int, max_steps: int, dest: str | None,
            transposed_out: bool, ckpt: Checkpoints, x0: np.ndarray | None = None,
            first: np.ndarray | None = None, v0: np.ndarray | None = None, bases: Any = None,
            spilled_finish: Any = None) -> Factorization:
    """Thick-restarted block Lanczos on ``B^T B`` (:func:`blocklin.linalg.lowrank.lanczos.block_lanczos`)
    to ``tol`` on every triplet, from ``x0`` (and its product ``first``) when given; then
    :func:`rayleigh_ritz` over the Ritz vectors and their residual directions.

    ``bases``: where the Krylov bases live (``block_lanczos``'s; default in memory). Spilled bases return
    the Ritz vectors on disk, and ``spilled_finish(Q)`` takes the final step from them instead
    (:func:`blocklin.linalg.lowrank.spilled_ritz.spilled_rayleigh_ritz`: no residual directions)."""
    floor = resolution_floor(src.dtype)

    def apply(x: np.ndarray, step: int) -> np.ndarray:
        return src.normal(x, description=f"lanczos: step {step}")[0]

    def threshold(theta: np.ndarray) -> np.ndarray:
        sig = np.sqrt(np.maximum(theta, 0))
        s1 = float(sig.max(initial=0.0))
        scale = np.maximum(sig, floor * s1)
        # triplet residual ||B^T u - s v|| = ||B^T B v - s^2 v|| / s <= tol * s (own singular value), but
        # never below the rounding of B^T B x, about eps s_1^2 (the null vectors of a rank-deficient A stop
        # there; a bound with sqrt(M) stopped float32 triplets below 0.4 s_1 far above their attainable accuracy)
        return np.maximum(tol * scale * scale, 10 * rounding_level(src.dtype, 1) * s1 * s1)

    if x0 is None and v0 is not None:
        x0 = start_block(src.N, plan.block, seed, v0, dtype=src.dtype)
    res = block_lanczos(apply, src.N, k, which="LA", block=plan.block, max_basis=plan.max_basis,
                        max_steps=max_steps, threshold=threshold, seed=seed, x0=x0, first=first,
                        state=ckpt.load("lanczos"), dtype=src.dtype,
                        checkpoint=(lambda state: ckpt.save("lanczos", **state)) if ckpt.enabled else None,
                        bases=bases)
    note = dict(res.repeated, note=f"Lanczos on B^H B (values: squared singular values): {res.note}") \
        if res.repeated else None
    if not isinstance(res.vectors, np.ndarray):  # spilled: the Ritz vectors stay on disk
        f = spilled_finish(res.vectors)
        return dataclasses.replace(f, lanczos_steps=res.steps, restarts=res.restarts, history=res.history, note=note)
    # The final pass takes the Rayleigh-Ritz step over the Ritz vectors and their residual directions
    # (one block Krylov step from them, at no extra pass: the pass is made anyway to write the long
    # factor). span [X, R] holds span(X), so its Ritz values can only get closer to the exact ones; in
    # practice their error drops by orders of magnitude (on the four spectra of benchmarks/svd.py from
    # 1e-13 - 1e-7 to 1e-15 - 1e-9), which is what lets the default tolerance target the singular values.
    Q = res.vectors
    e = enrich_width(k, plan.block, src.N)
    if e and res.residual_vectors is not None:
        with small_blas(src.N, 2 * k):
            Q = np.hstack([Q, orth_against(Q, res.residual_vectors, seed=seed, counter=res.steps + 1, width=e)])
    f = rayleigh_ritz(src, Q, k, dest, transposed_out, "lanczos", seed, tol=tol)
    return dataclasses.replace(f, lanczos_steps=res.steps, restarts=res.restarts, history=res.history,
                               rayleigh_ritz_width=int(Q.shape[1]), note=note)


def gram_subspace(g: np.ndarray, width: int) -> np.ndarray:
    """The eigenvectors of the ``width`` largest eigenvalues of the symmetric ``g``, descending."""
    n = g.shape[0]
    width = max(1, min(width, n))
    _, v = scipy.linalg.eigh(g, subset_by_index=(n - width, n - 1), overwrite_a=True, check_finite=False)
    return np.ascontiguousarray(v[:, ::-1])


def gram(src: Source, k: int, plan: SvdPlan, tol: float, seed: int, max_steps: int, dest: str | None,
         transposed_out: bool, ckpt: Checkpoints, start: np.ndarray | None = None,
         which: str = "LM") -> Factorization:
    """Rayleigh-Ritz over the top ``block`` eigenvectors of ``B^T B``, continued by block Lanczos from
    that subspace (and its product, no pass repeated) only where a triplet misses ``tol``.

    A block of ``N`` (every triplet asked, or nearly: :func:`blocklin.plan.svd.plan_svd`) takes every
    eigenvector of the Gram (a full ``eigh``, as scikit-learn's ``svd_solver="covariance_eigh"``) and
    the Rayleigh-Ritz step over that whole space (:func:`whole_space` with it as its basis), which is
    exact: the singular values come from ``B Q``, not from the Gram's eigenvalues, so the small ones
    carry ``eps s_1`` (as ``method="full"``), not the Gram's ``eps s_1^2 / s_i``, and no Lanczos step
    follows (``which``: the ``k`` largest or smallest of them).

    The Gram's eigenvectors are the wanted singular vectors up to its rounding, ``eps ||B||^2`` over
    the gap ``s_i^2 - s_{block+1}^2``; the Rayleigh-Ritz pass takes the singular values from ``B Q``
    (accurate to ``eps s_1``, as every method's) and measures every triplet's residual exactly, so
    the spectra where the Gram's rounding matters (singular values near ``sqrt(eps) s_1``) continue
    instead of returning inaccurate triplets. ``start``: the subspace when the Gram came from the
    means pass (centered or scaled ``A``)."""
    saved = ckpt.load("gram")
    if saved is not None:  # resume: the subspace (and, when the Rayleigh-Ritz step missed tol, its product)
        Q, Z = saved["Q"], saved.get("Z")
    else:
        if start is None:
            g = src.gram(description="gram: B^T B by SYRK")
            why = squares_lost(src, "gram")
            if why:  # the squares left float64's range for some columns: a route without squares
                del g  # not held through the fallback's passes (planned without it)
                return dataclasses.replace(tsqr_svd(src, k, dest, transposed_out, which, seed=seed), lanczos_steps=0,
                                           fallback=why)
        Q = start if start is not None else gram_subspace(g, plan.block)
        Z = None
        ckpt.save("gram", Q=Q)
    if Q.shape[1] >= src.N:  # the whole space: Rayleigh-Ritz is exact, nothing to continue
        return dataclasses.replace(whole_space(src, k, which, dest, transposed_out, seed, basis=Q, label="gram"),
                                   lanczos_steps=0)
    if Z is None:
        Z, G, Y = src.normal(Q, keep_y=True, gram=True, description="gram: Rayleigh-Ritz over the Gram's eigenvectors")
        f, Y, chain = project(src, Q, k, Z, G, Y, tol)
        if all(triplet_report(f.s, f.residuals, tol, src.dtype)["converged_triplets"]):
            return dataclasses.replace(write_long(f, Y, chain, dest, transposed_out, "gram", signs=src.signs,
                                                  seed=seed), lanczos_steps=0)
        del f, chain, G, Y
        ckpt.save("gram", Q=Q, Z=Z)
    return lanczos(src, k, plan, tol, seed, max_steps, dest, transposed_out, ckpt, x0=Q, first=Z)


def squares_lost(src: Source, method: str) -> str | None:
    """Why ``method`` (which works with ``B^T B``) cannot hold ``B``: the reason for the report's
    ``fallback``, or ``None``. Only an unshifted ``B`` falls back (the QR has no centering)."""
    if src.shift is not None:
        return None
    lost = squares_lose_columns(src.peaks)
    if not lost:
        return None
    return (f"{method} -> tsqr: {lost} nonzero column(s) of B have entries below 2^-511 times the largest, so "
            "their squares are out of float64's range in B^T B; the singular values come from the R factor of a "
            "streaming Householder QR instead (no squares)")


def tsqr_svd(src: Source, k: int, dest: str | None, transposed_out: bool, which: str = "LM",
             seed: int = 0) -> Factorization:
    """The SVD from ``B = Q R`` without squaring anything: ``R = U_R S V^T`` in memory, the long factor
    ``U = B (R^-1 U_R)`` from one pass that also gives ``B^T U`` (so every triplet's residual
    ``||B^T u - s v||`` is measured on ``B`` itself), then written. Householder QR keeps each column's
    rounding relative to that column's norm, so a matrix whose columns differ in scale by more than
    float64's range survives where ``B^T B`` does not (LAPACK's ``xGESDD`` starts with the same QR). Its
    singular values are kept down to their own rounding (no :func:`~blocklin.linalg.lowrank.triplets.numerically_zero`:
    that is this route's purpose); only exact zeros get a completed column of ``U``."""
    R = src.r_factor(k, description="tsqr: R factor of B (no squares)")
    with small_blas(R.shape[0], R.shape[1]):
        # xGESVD (QR iteration on the bidiagonal) keeps the small singular values of a graded R to their
        # own rounding; xGESDD's divide and conquer with vectors returned them at eps ||R|| (measured)
        Ur, S, Vrt = scipy.linalg.svd(R, lapack_driver="gesvd", check_finite=False)
    # R with an exact zero on its diagonal has no inverse: B is rank-deficient in the precision it was read in
    # (a column 2^-1200 times the largest, whose entries underflowed when B was scaled into range); the values
    # gesvd gives R's null space are rounding, zeros of B (numerically_zero), and on the range R^-1 U_R = V S^-1
    singular = not np.all(np.diagonal(R))
    s1 = float(S[0]) if S.size else 0.0
    idx = picked(S.size, k, which)
    S, Ur, Vrt = S[idx], Ur[:, idx], Vrt[idx]
    nz = (S > 0) & ~numerically_zero(S, s1, src.dtype, src.M) if singular else S > 0
    W = np.zeros((src.N, k), dtype=work_dtype(src.dtype))
    if nz.any() and singular:
        W[:, nz] = ct(Vrt[nz]) / S[nz]
    elif nz.any():  # Q^H u = U_R: u = B R^-1 U_R
        W[:, nz] = scipy.linalg.solve_triangular(R, Ur[:, nz], check_finite=False)
    sig, V = np.where(nz, S, 0.0), ct(Vrt).copy()
    del R, Ur, Vrt  # the N x N factors are not held through the last pass (planned without them)
    Z, _, Y = src.normal(W, keep_y=True, description="tsqr: the long factor and B^T U")
    resid = np.linalg.norm(Z - V * sig, axis=0)
    return write_long(Factorization(s=sig, V=V, residuals=resid, orth="tsqr"), Y, [np.eye(k, dtype=W.dtype)], dest,
                      transposed_out, "tsqr", signs=src.signs, seed=seed)
