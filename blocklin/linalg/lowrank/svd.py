"""Truncated SVD of out-of-core matrices: randomized (HMT), single-pass sketch, block Lanczos, Gram.

Every method works on the tall orientation ``B`` of ``A`` (``B = A`` when ``m >= n``, else ``B = A^T``
streamed as column strips of ``A``): the ``N``-long factor lives in memory, the ``M``-long one is
written to zarr by a final pass. Passes over ``A`` are what a method costs on disk; each is counted
and reported, and the formulas are those of :mod:`blocklin.plan.svd`.

This module is the public face: the arguments, the choice of method, the report and the result. The
rest of the room: :mod:`~blocklin.linalg.lowrank.budget` (the plan within the budget),
:mod:`~blocklin.linalg.lowrank.run` (one run of the plan), :mod:`~blocklin.linalg.lowrank.sources` (``B``
in memory or streamed), :mod:`~blocklin.linalg.lowrank.centering` (the means pass),
:mod:`~blocklin.linalg.lowrank.methods` (the methods and their :class:`~blocklin.linalg.lowrank.methods.Factorization`),
:mod:`~blocklin.linalg.lowrank.triplets` (how triplets are judged) and
:mod:`~blocklin.linalg.lowrank.checkpoint` (what a resumed run reads back).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from typing import Any, Unpack

import numpy as np

from blocklin.config import Settings
from blocklin.errors import ConvergenceWarning, ParameterError, explain, warn
from blocklin.linalg.blocks.center import Moments
from blocklin.linalg.blocks.results import open_group, write_group
from blocklin.linalg.blocks.scaling import check_finite_result, check_result_range, unscale_float
from blocklin.linalg.labels import label_svd, labels_of
from blocklin.linalg.lowrank.budget import check_disk_space, choose_plan
from blocklin.linalg.lowrank.checkpoint import checkpointed_seed, low_rank_token
from blocklin.linalg.lowrank.lanczos import repeated_beyond_block, rerun_wider_block
from blocklin.linalg.lowrank.methods import Factorization, component_signs
from blocklin.linalg.lowrank.operator_svd import is_operator, operator_svd
from blocklin.linalg.lowrank.spilled_ritz import StoredFactor
from blocklin.linalg.lowrank.svd_tolerance import default_tol
from blocklin.linalg.lowrank.run import SCALED_VALUES, run_planned
from blocklin.linalg.lowrank.triplets import triplet_report
from blocklin.linalg.lowrank.sparse_comoments import check_comoments_budget, sparse_comoments
from blocklin.linalg.lowrank.updatable import SKETCH_Y, check_updatable, keep_state, kept_state
from blocklin.matrix import Matrix
from blocklin.plan.svd import SvdPlan, gram_route_fits, sparse_basis, sparse_block
from blocklin.runtime.checkpoints import Checkpoints
from blocklin.runtime.job import Job
from blocklin.sparse import SparseMatrix, as_sparse_matrix, as_sparse_operator
from blocklin.storage import create_group, remove
from blocklin.storage.zarr_store import open_zarr
from blocklin.validate import (check_k, choice, count, flag, float_operand, positive, resolve_seed, seed_arg,
                               size, start_vector)


METHODS = ("auto", "rsvd", "sketch", "lanczos", "gram", "full")
#: ``which=``: the largest (``"LM"``) or the smallest (``"SM"``) singular values, as ``scipy.sparse.linalg.svds``.
WHICH = ("LM", "SM")
#: ``return_singular_vectors=`` as ``scipy.sparse.linalg.svds`` takes it.
RETURN_VECTORS = (True, False, "u", "vh")
def auto_power_iters(k: int, m: int, n: int) -> int:
    """``power_iters="auto"`` of ``rsvd`` without ``tol``: scikit-learn's ``n_iter="auto"`` (7 when
    ``k < 0.1 min(m, n)``, else 4) plus one, so that the default is at least as accurate as
    scikit-learn's (:func:`power_passes`)."""
    return power_passes(7 if k < 0.1 * min(m, n) else 4)


def power_passes(n_iter: int) -> int:
    """The fused power passes whose subspace is at least as good as scikit-learn's ``n_iter`` (and
    Dask's ``n_power_iter``): ``n_iter + 1``.

    Their range finder takes ``Q = orth((A A^T)^q A Omega)`` in ``2 q + 1`` products and approximates
    ``A`` by ``Q Q^T A``; ``q`` fused passes here take ``V = orth((A^T A)^q Omega)`` and approximate it
    by ``A V V^T``, half a step lower. With ``q + 1`` passes, ``V`` spans ``A^T Q``, and ``A V V^T`` is the
    best approximation with rows in that span, which ``Q Q^T A``'s rows are in: at most its error, in
    ``q + 2`` passes over ``A`` against ``2 q + 2`` (Halko, Martinsson, Tropp 2011, Sec. 4.5)."""
    return n_iter + 1


#: Most power iterations ``power_iters=`` asks for: ``(s_{k+1} / s_k)^(2q)`` has long stopped
#: improving the basis (and a huge count would run for hours on an in-core matrix).
MAX_POWER_ITERS = 100


def default_lanczos_block(k: int, oversample: int) -> int:
    """Block of the Lanczos SVD: ``k + oversample``, the wanted set in one block; the basis restarts
    at twice that (the in-memory work is then the same as with the half-width block and the
    ``3 (k + oversample)`` basis of :func:`blocklin.plan.svd.default_block`, which ``eigsh`` keeps).

    A pass costs about the same read whatever the block (bound by reading ``A`` for ``N`` in the
    hundreds), and a wider block takes fewer steps: on the slowly decaying ``(1 + i)^-1/2`` with
    ``k = 20`` (``N = 500``) 7 where the half-width block takes 8, on the fast decay 3 instead of 4.
    """
    return k + oversample


class SVDResult(tuple):
    """``(U, s, Vt)`` with a ``report`` attribute (unpacks like a 3-tuple).

    The long factor is a :class:`~blocklin.Matrix`, the short one and ``s`` NumPy arrays.
    """

    def __new__(cls, U: Any, s: np.ndarray, Vt: Any, report: dict, mean: np.ndarray | None = None,
                scale: np.ndarray | None = None, moments: Moments | None = None,
                scaled: tuple[Moments, int] | None = None, output: Any = None) -> SVDResult:
        obj = super().__new__(cls, (U, s, Vt))
        obj.report = report
        #: the stored group's Location (its storage options with it), None where nothing was stored:
        #: what :meth:`delete` removes when no stored factor names it
        obj.output = output
        obj.mean = mean  # column means subtracted (center=True), else None
        obj.scale = scale  # column standard deviations divided by (scale=True), else None
        obj.moments = moments  # the column means and variances when centered or scaled
        #: ``(moments of 2^-e A, e)`` when the data was scaled (blocklin.linalg.blocks.scaling): variances beyond
        #: float64's range (entries beyond 2^512) are inf or 0 in ``moments``, finite here
        obj.scaled_moments = scaled
        return obj

    @property
    def U(self) -> Any:
        return self[0]

    @property
    def s(self) -> np.ndarray:
        return self[1]

    @property
    def Vt(self) -> Any:
        return self[2]

    def delete(self) -> None:
        """Remove the result's group (``report["output"]``, a temporary one where ``out=None``): the
        stored factor and ``S`` and the other factor stored beside it; ``s`` and the in-memory factor
        stay usable (:func:`~blocklin.linalg.blocks.results.delete_output`)."""
        from blocklin.linalg.blocks.results import delete_output

        delete_output(self)


def resolve_method(method: str, power_iters: int | str, *, shape: tuple[int, int], k: int, oversample: int,
                   shifted: bool = False, which: str = "LM", asked: str | None = None) -> str:
    """``"auto"``: ``full`` for every triplet (``k = min(m, n)``) or the smallest (``which="SM"``);
    ``rsvd`` when the power iterations are fixed (a fixed cost); else the Gram route for narrow tall
    orientations (:func:`blocklin.plan.svd.gram_route_fits`; a centered or scaled one only for tall
    ``A``: a wide one takes it when asked, ``method="gram"``), block Lanczos to ``tol`` otherwise.
    ``asked``: the count as the caller passed it (``"n_components=None"``), which a refusal names."""
    m, n = shape
    M, N = max(m, n), min(m, n)
    whole = k == N or which == "SM"
    # rsvd's subspace, of min(k + oversample, N) columns, is then the whole space: its Rayleigh-Ritz
    # step is exact, as scikit-learn's randomized_svd with n_components = min(m, n)
    # gram too, for k = N: a full eigh of the Gram, then the Rayleigh-Ritz step over the whole space
    if (method not in ("auto", "full") and whole and not (method == "rsvd" and which == "LM")
            and not (method == "gram" and k == N)):
        asked = asked or f"k={k}"
        name = asked.split("=")[0]
        why = f"{asked} (all {N} = min(m, n) computed)" if k == N else "which='SM'"
        raise ParameterError(explain(
            "method", "the smallest triplets, or all of them, come from the whole space (method='full', or 'gram' for all "
            "of them)",
            f"method={method!r} with {why} for a {m} x {n} matrix",
            f"pass method='auto' (or 'full'), or an integer {name} < min(m, n) = {N} with which='LM' for the "
            "largest triplets"))
    if method != "auto":
        return method
    if whole:
        return "full"
    if power_iters != "auto":
        return "rsvd"
    return "gram" if gram_route_fits(M, N, k, oversample) and not (shifted and m < n) else "lanczos"


@rerun_wider_block
def svd(a: Any, k: int | None = None, *, which: str = "LM", return_singular_vectors: bool | str = True,
        method: str = "auto", oversample: int = 10, power_iters: int | str = "auto", n_iter: int | str | None = None,
        tol: float | None = None, out: Any = None, seed: int | None = None,
        max_passes: int | None = None, block_size: int | None = None, max_basis: int | None = None,
        overwrite: bool = False, center: bool = False, scale: bool = False, resume: bool = False,
        v0: Any = None, updatable: bool = False, **settings: Unpack[Settings]) -> SVDResult | np.ndarray:
    """Truncated SVD ``A ~ U diag(s) Vt`` of an out-of-core matrix, counting passes over ``A``.

    Parameters
    ----------
    a : path, zarr array, Matrix, NumPy or Dask array, or xarray DataArray
        ``m x n``, float32 or float64, or complex64 or complex128 (``A = U diag(s) V^H``, ``Vt = V^H``
        as NumPy's ``vh``, ``s`` real; each triplet's phase makes the largest-modulus entry of the short
        factor's vector real positive: docs/svd.md, Complex data); tall, wide or square (wide matrices
        are processed as ``A^T`` read in column strips, never copied). A ``DataArray`` gives labelled factors
        (:mod:`blocklin.linalg.labels`): ``U`` over (rows, ``mode``), ``s`` over ``mode``, ``Vt`` over
        (``mode``, columns), with the input's coordinates; the stored factors are then ``result.stored``.
    k : int, optional
        Number of singular triplets, ``1 <= k <= min(m, n)``. ``None`` (default) or ``min(m, n)``: every
        triplet, the thin SVD ``numpy.linalg.svd(a, full_matrices=False)`` returns (``method="full"``).
    which : {"LM", "SM"}
        The ``k`` largest (default) or smallest singular values, as ``scipy.sparse.linalg.svds``; the
        smallest come from ``method="full"``. Returned in descending order either way (``svds`` returns
        ascending values: ``s[::-1]`` to compare).
    return_singular_vectors : {True, False, "u", "vh"}
        As ``scipy.sparse.linalg.svds``: ``False`` returns the singular values alone (a NumPy array),
        ``"u"`` ``(U, s, None)``, ``"vh"`` ``(None, s, Vt)``. A long factor that is not returned is
        never written (a pass over the stored intermediate less, and no disk for it).
    method : {"auto", "rsvd", "sketch", "lanczos", "gram", "full"}
        * ``auto`` (default): ``full`` for ``k = min(m, n)`` or ``which="SM"``; ``gram`` for narrow
          matrices (short side ``N <= 24 (k + oversample)``, long side at least ``8 N``, the Gram
          within the budget; a centered or scaled wide one only with ``method="gram"``), else ``lanczos``, both to ``tol`` (default ``sqrt(10 sqrt(eps))``); ``rsvd`` when
          ``power_iters`` is an integer (a fixed cost). The shape alone decides, never the machine.
          On slowly and fast decaying spectra, flat tails and low rank plus noise the default reaches
          the rounding of the data, where scikit-learn's ``randomized_svd`` and Dask's
          ``svd_compressed`` with their defaults stop at up to 2.4e-4 and 0.5 (docs/svd.md has the
          figures).
        * ``rsvd``: randomized subspace iteration (Halko, Martinsson, Tropp 2011, Alg. 4.4) with
          ``l = k + oversample`` columns. Each power iteration is ONE fused pass ``Z = A^T (A Q)``
          strip by strip, re-orthonormalized in memory (Householder QR of the ``n x l`` block); the
          final pass stores ``Y = A Q`` and its Gram matrix, ``Y`` is orthonormalized out of core by
          CholeskyQR2 (shifted CholeskyQR3 / TSQR fallback, :mod:`blocklin.linalg.blocks.orth`), and the
          singular values are those of ``R``. Passes over ``A``: ``q + 1``.
        * ``sketch``: single-pass streaming sketch (Tropp, Yurtsever, Udell, Cevher 2019, SIAM J.
          Sci. Comput. 41(4)): range ``Y = A Omega``, co-range ``X = Upsilon A`` and core
          ``Z = Phi A Psi^T`` in one read of ``A``; ``sketch sizes k + oversample`` and
          ``2 (k + oversample) + 1``. Residuals are not available (they would need a second pass).
        * ``lanczos``: thick-restarted block Lanczos on the normal operator (block Golub-Kahan,
          Golub and Kahan 1965; reorthogonalized as in Larsen's PROPACK; thick restart of Baglama
          and Reichel 2005), one fused pass per step, converged to ``tol`` on the residual of every
          triplet; one more pass writes the long factor. Passes: ``L + 1``.
        * ``gram``: one SYRK pass forms ``B^T B`` (float64 sums), its top ``k + oversample``
          eigenvectors are the subspace of one Rayleigh-Ritz pass (the final step of ``rsvd`` and
          ``lanczos``: singular values from ``B Q``, exact residuals); triplets that still miss
          ``tol`` (singular values near ``sqrt(eps) s_1``, where the Gram's rounding shows) continue
          by block Lanczos from that subspace. Passes: 2 (``2 + L``). Holds ``3 N^2`` float64 in
          memory; with ``center``/``scale`` the means pass makes the centered (scaled) Gram: of a tall
          ``A`` from the strips' co-moments (Chan, Golub, LeVeque's update), of a wide ``A`` the
          ``m x m`` ``A_c A_c^H`` from its columns centered by their own means as they are read
          (scikit-learn's ``covariance_eigh`` of either shape), ``V = A_c^H U S^-1`` from the
          Rayleigh-Ritz pass. Every triplet (``k = min(m, n)``; or ``k + oversample >= min(m, n)``
          with the planned block): every eigenvector of the Gram (a full ``eigh``) and the
          Rayleigh-Ritz step over that whole space, as ``full`` (the same accuracy, smallest values
          included: they come from ``B Q``, not from the Gram's eigenvalues), no Lanczos step.
        * ``full``: the Rayleigh-Ritz step over the whole space (every triplet, or the ``k`` smallest):
          one pass stores ``B`` with its Gram matrix, ``B = Q R`` (CholeskyQR2, rank-revealing TSQR
          where it breaks down), the SVD of ``R`` by LAPACK in memory, ``U = Q U_R`` written: LAPACK's
          own route for tall matrices (Chan 1982), with its backward error, smallest values included.
          Passes: 1 (and 3 over the stored copy of ``B``, which needs ``B``'s size on disk); holds
          about ``22 N^2`` float64 in memory.
    oversample : int
        Extra columns of the random block (``rsvd``, ``sketch``) or of the wanted set (``lanczos``).
    power_iters : int or "auto"
        ``rsvd`` power iterations ``q``, each one fused pass ``Z = A^T (A Q)``: ``q + 1`` passes in all
        (``0``: one pass, the Rayleigh-Ritz values of a random subspace, exact for no rank).
        ``q`` fused passes build scikit-learn's ``n_iter = q - 1`` subspace and half a step more
        (:func:`power_passes`; pass ``n_iter=`` for scikit-learn's count). ``"auto"``: adaptive when
        ``tol`` is given (stop when every triplet's relative residual is ``<= tol``, at most
        ``max_passes`` passes), else scikit-learn's default plus one (:func:`auto_power_iters`: 8 when
        ``k < 0.1 min(m, n)``, else 5), at least as accurate as scikit-learn's and Dask's defaults in
        about half their passes. An integer with ``method="auto"`` selects ``rsvd``.
    n_iter : int or "auto", optional
        scikit-learn's ``randomized_svd(n_iter=)`` (Dask's ``n_power_iter``): ``rsvd`` with
        ``power_iters = n_iter + 1``, at least as accurate as theirs in ``n_iter + 2`` passes against
        their ``2 n_iter + 2``; ``"auto"`` their rule (7 when ``k < 0.1 min(m, n)``, else 4). Not with
        ``power_iters``.
    tol : float, optional
        Accuracy target: every triplet's residual relative to its own singular value,
        ``||A^T u_i - s_i v_i|| <= tol * max(s_i, sqrt(eps) s_1)`` (the floor: singular values at the
        rounding level of ``s_1``, such as the zeros of a rank-deficient matrix). ``lanczos`` (and
        ``auto``) default ``sqrt(10 sqrt(eps))`` (3.9e-4 in float64): it targets the singular values,
        whose error is about the square of the residual, to ``10 sqrt(eps)`` relative (measured:
        1e-9 on a slowly decaying spectrum, a few ``eps`` on fast decay, flat tails and low rank plus
        noise; docs/svd.md). ``tol=10 * sqrt(eps)`` gives residuals (vectors) at that level and the
        singular values to a few ``eps``. The passes follow from it. A tolerance not reached within the pass limit gives a
        :class:`~blocklin.errors.ConvergenceWarning` naming the triplets and the worst one. ``rsvd``
        with a fixed ``power_iters`` and no ``tol`` runs its passes and is judged against the default:
        ``report["converged"]`` is ``False``, with the warning, where a residual is above it.
    out : path, optional
        Write a zarr group with ``U``, ``S``, ``Vt`` and the report in its attributes.
    seed : int, NumPy Generator, RandomState or SeedSequence, optional
        Seed of the counter-based random test matrices: results are deterministic for a seed,
        whatever the budget, scheduler or workers. ``None`` draws one (recorded in the report); a
        generator (scikit-learn's ``random_state``) gives one integer drawn from it.
    overwrite : bool
        Replace an existing ``out``.
    v0 : array_like, optional
        A starting vector of length ``min(m, n)`` (``scipy.sparse.linalg.svds``' ``v0``: an approximate
        right singular vector of tall ``A``, left of wide ``A``): the first column of the starting block
        of ``rsvd`` and ``lanczos`` (the others do not start from a vector).
    updatable : bool
        Keep the co-moments of ``A`` (count, means, centered Gram: ``n x n`` float64, one pass more) in
        ``out``, so that :func:`blocklin.update` brings the result up to date after rows are appended
        (:func:`blocklin.append`) by reading only those rows (:mod:`blocklin.linalg.update.svd`). Tall
        ``A``, ``which="LM"``. ``method="sketch"`` keeps its own state instead, at no pass more (the
        sums ``X^T``, ``Phi^T [Y T]``, ``Y^T Y`` in float64 and the range sketch ``Y``, ``m x (k +
        oversample)``): its update sketches the new rows alone with the same seed and equals the sketch
        of the grown matrix up to the order of its sums (:mod:`blocklin.linalg.update.sketch`); not
        with ``center`` or ``scale``, which move every row's sketch.
    resume : bool
        Continue the run that was writing ``out`` when it was interrupted (SIGKILL, Ctrl-C, a crash)
        with the same input, parameters and budget: the passes it completed are skipped (their
        results are checkpointed in the unfinished output, :mod:`blocklin.runtime.checkpoints`) and the
        result is identical, bit for bit, to an uninterrupted run. Without an unfinished run it
        starts afresh. Needs ``out``.
    center : bool
        Factor ``A - 1 mu^T`` with ``mu`` the column means (principal component analysis), without
        writing a centered copy: the rank-one correction is applied inside every pass
        (:mod:`blocklin.linalg.blocks.center`). Costs one more pass over ``A`` for the means, none when
        ``A`` fits the budget (it is then centered in memory). Complex data: complex means (complex128).
    scale : bool
        Also divide each column by its standard deviation (``ddof=0``, as scikit-learn's
        ``StandardScaler``; a constant column is left unscaled; of complex data the real
        ``sqrt(mean |x - mu|^2)``): standardized PCA. Alone (without
        ``center``) it scales by the same standard deviations without subtracting the means.
    max_passes : int, optional
        Pass limit of the adaptive methods (default 20 for ``rsvd``, 60 for ``lanczos`` and ``gram``).
    block_size, max_basis : int, optional
        ``lanczos`` block size and restart basis size (``gram``: the Rayleigh-Ritz width and those of
        its continuation; default ``k + oversample`` and twice that;
        with only one of them given, the other follows :func:`blocklin.plan.svd.plan_svd`). A ``lanczos``
        run that finds a value as often as its planned block is wide is made again with a wider block
        (:func:`~blocklin.linalg.lowrank.lanczos.rerun_wider_block`).
    **settings
        As for every operation: :class:`~blocklin.config.Settings` (``progress``: one bar per pass).

    Returns
    -------
    SVDResult
        ``U, s, Vt = result``. The long factor (``U`` for tall, ``Vt`` for wide ``A``) is always a
        :class:`~blocklin.Matrix` (stored in ``out``, or in a temporary group you own), whether ``A``
        fitted the budget or not; the other factor and ``s`` (descending) are NumPy arrays. ``result.report`` holds
        ``passes`` (over ``A``), ``intermediate_passes``, ``bytes_read``, ``seconds``,
        ``peak_memory``, ``center``, ``scale``, ``residuals``: per triplet ``||A^T u - s v||`` (``A v - s u``
        is zero by construction), ``relative_residuals`` (each divided by its own ``s_i``, floored at
        ``sqrt(eps) s_1``), ``converged_triplets`` and ``worst_triplet`` (1-based ``index``, ``s``,
        ``relative_residual``, ``converged``). A matrix of rank ``r < k`` gives ``s_i = 0`` (to
        rounding) for ``i > r`` with zero columns in the long factor (``A = U diag(s) Vt`` still holds).
        With ``center`` or ``scale``, the factors are
        those of the centered (scaled) matrix, ``result.mean`` and ``result.scale`` hold the column
        means and standard deviations used (``None`` when not), ``result.moments`` the column means
        and variances, and ``out`` also stores them as ``mean`` and ``scale``.

    Notes
    -----
    A matrix that fits the budget (twice its size plus the small factors) is read once and
    factored in memory with the same algorithm (``passes == 1``). The subspace comes from ``A^T A``, so the
    singular *vectors* of singular values below ``sqrt(eps) * s_1`` are not resolved (as for every
    method working on ``A^T A``; use float64 for such a dynamic range); the singular values come
    from the final Rayleigh-Ritz step on ``A Q`` and are accurate to ``eps * s_1``.

    References
    ----------
    N. Halko, P.-G. Martinsson, J. A. Tropp, "Finding structure with randomness", SIAM Review 53(2), 2011.
    J. A. Tropp, A. Yurtsever, M. Udell, V. Cevher, "Streaming low-rank matrix approximation with an
    application to scientific simulation", SIAM J. Sci. Comput. 41(4), 2019.
    G. Golub, W. Kahan, "Calculating the singular values and pseudo-inverse of a matrix", 1965.
    T. F. Chan, "An improved algorithm for computing the singular value decomposition", ACM TOMS 8(1), 1982.
    J. Baglama, L. Reichel, "Augmented implicitly restarted Lanczos bidiagonalization methods", 2005.
    T. F. Chan, G. H. Golub, R. J. LeVeque, "Algorithms for computing the sample variance: analysis and
    recommendations", The American Statistician 37(3), 1983 (the centered Gram's pairwise merge).

    Examples
    --------
    >>> import numpy as np
    >>> import blocklin as bl
    >>> x = np.random.default_rng(0).standard_normal((500, 40)) * np.logspace(0, -3, 40)
    >>> U, s, Vt = res = bl.svd(x, 3, seed=0)
    >>> U.shape, s.shape, Vt.shape
    ((500, 3), (3,), (3, 40))
    >>> np.allclose(s, np.linalg.svd(x, compute_uv=False)[:3])
    True
    """
    lab = labels_of(a)
    res = factorize(a, k, which=which, return_singular_vectors=return_singular_vectors, method=method,
                    oversample=oversample, power_iters=power_iters, n_iter=n_iter, tol=tol, out=out, seed=seed,
                    max_passes=max_passes, block_size=block_size, max_basis=max_basis, overwrite=overwrite,
                    center=center, scale=scale, resume=resume, v0=v0, updatable=updatable, **settings)
    if lab is None:
        return res
    if isinstance(res, np.ndarray):  # the singular values alone
        return label_svd(SVDResult(None, res, None, {}), lab)[1]
    return label_svd(res, lab)


def factorize(a: Any, k: int | None, *, which: str = "LM", return_singular_vectors: bool | str = True,
              method: str = "auto", oversample: int = 10, power_iters: int | str = "auto",
              n_iter: int | str | None = None,
              tol: float | None = None, out: Any = None, seed: int | None = None, max_passes: int | None = None,
              block_size: int | None = None, max_basis: int | None = None, overwrite: bool = False,
              center: bool = False, scale: bool = False, resume: bool = False,
              lanczos_tol: Any = default_tol, check_shape: Any = None, signs: bool = False,
              v0: Any = None, updatable: bool = False, caller: str = "svd", asked: str | None = None,
              record: Any = None, operator_mean: Any = None, own_open: bool = False,
              **settings: Unpack[Settings]) -> SVDResult | np.ndarray:
    """:func:`svd` with the default Lanczos tolerance a function of the dtype (``lanczos_tol``):
    ``eigsh(center=True)`` keeps its residual tolerance ``10 sqrt(eps)`` through it. ``check_shape(m, n)``
    refuses a shape before anything is read (``pca(n_components="mle")``). ``signs``: every triplet
    signed by scikit-learn's rule on the right singular vectors (PCA's components), in the returned
    and the stored factors alike. ``caller``: the public function a refusal names (``pca``, ``eigsh``);
    ``asked``: the count as its caller passed it (``"n_components=0.95"``), ``k=`` as given by default.
    ``record(moments, scaled_moments)``: what the caller records of its own in the stored group's
    provenance, ``params["pca"]`` (the options a stored PCA is opened and updated with); of an operator
    (a stored sparse PCA's centered one) ``record(None, None)``, stored with ``operator_mean``, the column
    means it centers by, as a centered SVD's ``mean``. ``own_open``: the stored sparse matrix of ``a`` (itself,
    or the one a centered operator reads) was opened by the caller from a path, for this run (its stamp
    taken unchecked), as one opened here is."""
    method = choice("method", method, METHODS, fix="pass method='auto'")
    which = choice("which", which, WHICH, fix="pass which='LM' (largest) or which='SM' (smallest)")
    vectors = choice("return_singular_vectors", return_singular_vectors, RETURN_VECTORS,
                     fix="pass return_singular_vectors=True, False, 'u' or 'vh'")
    oversample = count("oversample", oversample, fix="pass oversample=10")
    power_iters = count("power_iters", power_iters, auto=("auto",), maximum=MAX_POWER_ITERS,
                        why="each costs two passes over A, and past a few dozen they no longer sharpen the basis",
                        fix="pass power_iters=2, or method='lanczos' (converged to tol) for a slowly decaying spectrum")
    n_iter = None if n_iter is None else count("n_iter", n_iter, minimum=0, auto=("auto",),
                                               maximum=MAX_POWER_ITERS - 1, fix="pass n_iter=4 (scikit-learn's count)")
    if n_iter is not None and power_iters != "auto":
        raise ParameterError(explain("n_iter", "is scikit-learn's name for power_iters - 1: pass one of them",
                                     f"n_iter={n_iter!r} and power_iters={power_iters!r}",
                                     f"pass n_iter={n_iter!r} alone"))
    tol = positive("tol", tol, optional=True, fix="pass tol=1e-6")
    max_passes = size("max_passes", max_passes, fix="pass max_passes=60, or None for the default")
    block_size = size("block_size", block_size, fix="pass block_size=8, or None for the planned one")
    max_basis = size("max_basis", max_basis, fix="pass max_basis=32, or None for the planned one")
    seed = seed_arg(seed)  # a generator draws its integer once, before the token names it
    updatable = flag("updatable", updatable)
    requested = method
    opened = as_sparse_matrix(a, settings.get("storage_options"))  # a stored sparse group: its row-block operator
    own_open, a = own_open or opened is not a, opened
    if is_operator(a):
        return _returned(_of_operator(a, k, method=method, oversample=oversample, power_iters=power_iters,
                                      n_iter=n_iter, tol=tol, seed=seed, out=out, max_passes=max_passes,
                                      block_size=block_size, max_basis=max_basis, overwrite=overwrite,
                                      vectors=vectors, refused={"center": center, "scale": scale, "resume": resume,
                                                                "which='SM'": which == "SM", "v0": v0 is not None,
                                                                "updatable": updatable and stored_sparse(a) is None},
                                      updatable=updatable,
                                      lanczos_tol=lanczos_tol, settings=settings, signs=bool(signs),
                                      pca=record(None, None) if record is not None and out is not None else None,
                                      mean=operator_mean, own_open=own_open), vectors)
    with Job("svd", **settings) as job:
        A = job.operand(a, "a", integers="cast")
        dt = float_operand(A, "svd", complex_ok=True)
        if dt.kind == "c":
            signs = True  # the phase convention: the short factor's (methods.component_signs)
        m, n = A.shape
        if check_shape is not None:
            check_shape(m, n, dt)
        asked = asked or f"k={k!r}"
        k = check_k(min(m, n) if k is None else k, m, n, whole=True)
        v0 = start_vector(v0, min(m, n))
        if n_iter is not None:  # scikit-learn's count: rsvd with one fused pass more (power_passes)
            power_iters = power_passes(7 if k < 0.1 * min(m, n) else 4) if n_iter == "auto" else power_passes(n_iter)
        method = resolve_method(method, power_iters, shape=(m, n), k=k, oversample=oversample,
                                shifted=bool(center or scale), which=which, asked=asked)
        q = (None if tol is not None else auto_power_iters(k, m, n)) if power_iters == "auto" else power_iters
        limit = max_passes or (20 if method == "rsvd" else 60)
        if method in ("lanczos", "gram") and block_size is None and max_basis is None:
            block_size, max_basis = default_lanczos_block(k, oversample), 2 * default_lanczos_block(k, oversample)
        tol = lanczos_tol(A.dtype) if method in ("lanczos", "gram") and tol is None else tol
        kw = dict(method=method, oversample=oversample, power_iters=q if method == "rsvd" else None,
                  max_passes=limit, block_size=block_size, max_basis=max_basis)
        if updatable:  # what the shape and method already refuse, before a budget is named for it
            check_updatable(out=out, method=method, which=which, transposed=m < n, shape=(m, n),
                            center=bool(center), scale=bool(scale))
        plan = choose_plan(job, A, k, kw, requested=requested, shift=(bool(center), bool(scale)))
        if updatable:
            check_updatable(out=out, method=plan.method, which=which, transposed=plan.transposed, shape=(m, n),
                            center=bool(center), scale=bool(scale))
        check_disk_space(job, out, plan, m, n, k, A.dtype)
        long_wanted = vectors is True or vectors == ("vh" if plan.transposed else "u")
        token = low_rank_token(job, A, op="svd", k=k, method=plan.method, oversample=oversample, q=q, tol=tol,
                               limit=limit, block=plan.block, basis=plan.max_basis, center=bool(center),
                               scale=bool(scale), memory=job.cfg.memory, seed=seed, which=which,
                               long=long_wanted, signs=bool(signs), v0=v0, updatable=updatable)
        ao = open_group(job, out, A, overwrite, resume=resume, token=token)
        made: dict = {}  # the co-moments, where the method's means pass makes them
        ckpt = Checkpoints(ao, enabled=out is not None)
        seed = checkpointed_seed(ckpt, seed)
        f = run_planned(job, A, plan, k=k, q=q, tol=tol, seed=seed, limit=limit, ckpt=ckpt,
                        dest=ao.array_path("Vt" if plan.transposed else "U") if long_wanted else None,
                        center=bool(center), scale=bool(scale), which=which, signs=bool(signs), v0=v0,
                        keep=made if updatable else None,
                        sketch_y=ao.array_path(SKETCH_Y) if updatable and plan.method == "sketch" else None)
        state = keep_state(job, A, job.cfg.memory, made) if updatable else None
        report = _report(job, plan, f, tol=tol, seed=seed, oversample=oversample, center=bool(center),
                         scale=bool(scale), requested=requested, resumed=ao.resumed,
                         restored=[name for name in ckpt.restored if name != "seed"])
        report["which"] = which
        ckpt.clear()
        if signs and plan.transposed and long_wanted and A.dtype.kind != "c":  # the components: the long factor
            f = _signed_long(f, ao.array_path("Vt"))
        kept = None if state is None else (state, {"k": k, "center": bool(center), "scale": bool(scale),
                                                   "signs": bool(signs), "tol": tol, "count": m, "method": plan.method,
                                                   "oversample": oversample, "seed": seed,
                                                   **_sketch_kept(plan, f)})
        res = _result(job, out, A.dtype, plan, f, report, ao, overwrite, long_wanted, kept,
                      record(f.moments, f.scaled_moments) if record is not None and out is not None else None)
    return _returned(res, vectors)


def _sketch_kept(plan: SvdPlan, f: Factorization) -> dict:
    """What an update of a single-pass sketch reads beside its state: the sketch sizes, the power of
    two its data was divided by (the state is that of ``2^-e A``; :mod:`blocklin.linalg.blocks.scaling`)
    and the version of the generator of its test matrices (its appended rows draw from the same)."""
    if plan.method != "sketch":
        return {}
    return {"sketch_size": list(plan.sketch_size), "exponent": int((f.scaling or {}).get("exponent", 0)),
            "generator": int(f.sketch_generator)}


def _of_operator(op: Any, k: Any, *, method: str, oversample: int, power_iters: Any, n_iter: Any, tol: Any,
                 seed: int | None, out: Any, max_passes: Any, block_size: Any, max_basis: Any, overwrite: bool,
                 vectors: Any, refused: dict, lanczos_tol: Any, settings: dict, pca: dict | None = None,
                 mean: np.ndarray | None = None, signs: bool = False, updatable: bool = False,
                 own_open: bool = False) -> SVDResult:
    """The SVD of a SciPy ``LinearOperator`` (:mod:`blocklin.linalg.lowrank.operator_svd`): rsvd or block
    Lanczos through its products, the result stored as every SVD's; ``pca`` and ``mean``: a sparse PCA's
    record and the column means its operator centers by, stored beside the factors (:func:`_result`);
    ``signs``: every triplet signed by scikit-learn's rule on the components (:func:`_signed_in_group`);
    ``updatable`` (a stored sparse matrix): the co-moments of its rows kept beside the factors
    (:mod:`blocklin.linalg.lowrank.sparse_comoments`), which :func:`blocklin.update` reads; ``own_open``:
    its stored sparse matrix opened by this call from a path (:func:`factorize`)."""
    asked = [name for name, on in refused.items() if on]
    sparse = isinstance(op, SparseMatrix)
    if asked:  # a stored sparse matrix is the matrix itself: its fix is a dense copy
        what = "a stored sparse matrix" if sparse else "a LinearOperator"
        raise ParameterError(explain("a", f"{what} takes rsvd or block Lanczos for the largest triplets only "
                                     "(its products, not its entries)", f"{what} with {', '.join(asked)}",
                                     "write it densely (blocklin convert S.zarr D.zarr --dense) and pass that"
                                     if sparse else "pass the matrix itself (a path, a Matrix or an array) for those"))
    if k is None:  # lstsq and cond of a sparse matrix come here too: name what they asked for
        what = "a stored sparse matrix" if sparse else "a LinearOperator"
        raise ParameterError(explain(
            "k", f"must be an integer for {what}: its SVD is truncated (the k largest triplets); every singular "
            "value (k=None, as blocklin.lstsq and blocklin.cond ask for) needs the matrix itself",
            f"k=None for {what} of shape {op.shape[0]} x {op.shape[1]}",
            "pass 1 <= k < min(m, n)" + ("; for least squares, blocklin.solve(S, b) (LSQR, lam= for ridge)"
                                        if sparse else "")))
    op = as_sparse_operator(op)  # a stored sparse matrix: float64 products for integer values
    dt = np.dtype(op.dtype)
    if dt not in (np.float32, np.float64):
        raise ParameterError(explain("a", "must be a float32 or float64 LinearOperator", dt.name,
                                     "wrap the operator with dtype=float64"))
    m, n = op.shape
    k, method, q, tol, limit, block_size, max_basis = operator_options(
        (m, n), dt, k, method=method, oversample=oversample, power_iters=power_iters, n_iter=n_iter, tol=tol,
        max_passes=max_passes, block_size=block_size, max_basis=max_basis, lanczos_tol=lanczos_tol)
    long_wanted = vectors is True or vectors == ("vh" if m < n else "u")
    if updatable:
        check_updatable(out=out, method=method, which="LM", transposed=m < n, shape=(m, n))
    with Job("svd", **settings) as job:
        stored = stored_sparse(op)
        if stored is not None:  # as opened, before its first read: refused if S changed since
            job.stamp_input(stored.location, stored.stamp, own_open=own_open)
        if updatable:  # before the factorization is run for nothing
            check_comoments_budget(n, job.cfg.memory)
        # never onto, nor inside, S; covering the rows read (an append may commit after S was opened)
        ao = job.output(out, inputs=stored_operands(op), overwrite=overwrite, covered=stored_operands(op, rows=True))
        create_group(ao.array_path())
        seed = resolve_seed(seed)
        f, plan, products = operator_svd(job, op, k, method=method, oversample=oversample, q=q, tol=tol, seed=seed,
                                         limit=limit, block_size=block_size, max_basis=max_basis,
                                         dest=ao.array_path("Vt" if m < n else "U") if long_wanted else None,
                                         short_dest=ao.array_path("U" if m < n else "Vt"))
        report = _report(job, plan, f, tol=tol, seed=seed, oversample=oversample, center=False, scale=False,
                         requested=method, resumed=False, restored=[], operator_products=products)
        report.update(passes=products, operator_products=products, which="LM",
                      passes_formula=f"{plan.formula} (products with the operator: matmat and rmatmat)")
        if mean is not None:
            f = dataclasses.replace(f, mean=np.asarray(mean))
        if signs:
            f = _signed_in_group(f, ao, transposed=m < n)
        kept = None
        if updatable:  # the co-moments of S's rows (one pass more), and what was factored
            mom, c = sparse_comoments(stored_sparse(op), 0, m, job.cfg.memory)
            kept = (keep_state(job, None, job.cfg.memory, kept_state(mom, c)),
                    {"k": k, "center": mean is not None, "scale": False, "signs": bool(signs), "tol": tol, "count": m,
                     "method": plan.method, "oversample": oversample, "seed": seed})
            report["passes_formula"] = f"{report['passes_formula']} + 1 (the co-moments an update reads)"
        return _result(job, out, dt, plan, f, report, ao, overwrite, long_wanted, kept, pca=pca)


def _signed_in_group(f: Factorization, ao: Any, *, transposed: bool) -> Factorization:
    """The operator route's triplets signed by scikit-learn's rule on the components (the rows of
    ``Vt``: ``svd_flip``), in the partial group before the commit: the factors it holds already (the
    long one, and a spilled short one) are read whole, as the route held them (``M x k`` or ``k x N``),
    and rewritten; the short factor in memory with them. Real operators only (the route's dtypes)."""
    stored = [name for name in ("U", "Vt") if ao.has_array(name)]
    if "Vt" in stored:
        vt = np.asarray(open_zarr(ao.array_path("Vt"), allow_pending=True)[...])
    else:  # the short factor of a tall operator, N x k in memory
        vt = np.asarray(f.V).T
    d = component_signs(vt.T)
    for name in stored:
        arr = open_zarr(ao.array_path(name), mode="r+", allow_pending=True)
        vals = vt if name == "Vt" else np.asarray(arr[...])
        arr[...] = vals * (d[:, None] if name == "Vt" else d[None, :]).astype(vals.dtype)
    return f if isinstance(f.V, StoredFactor) else dataclasses.replace(f, V=f.V * d)


def stored_operands(op: Any, *, rows: bool = False) -> list[Any]:
    """The stored matrix a LinearOperator reads (a :class:`~blocklin.sparse.SparseMatrix`, its row-block
    operator, or a stored sparse PCA's centered operator over one; none for other operators): the input
    its result is never written onto nor inside. ``rows``: as ``(path, rows read)``, what the result covers."""
    x = stored_sparse(op)
    if x is None:
        return []
    return [(x.path, int(x.shape[0])) if rows else x.path]


def stored_sparse(op: Any) -> SparseMatrix | None:
    """The :class:`~blocklin.sparse.SparseMatrix` a LinearOperator reads (:func:`stored_operands`), or None."""
    for x in (op, getattr(op, "sparse_operator", None)):
        x = getattr(x, "matrix", x)
        if isinstance(x, SparseMatrix):
            return x
    return None


def operator_options(shape: tuple[int, int], dtype: Any, k: Any, *, method: str, oversample: int, power_iters: Any,
                     n_iter: Any, tol: Any, max_passes: Any, block_size: Any, max_basis: Any,
                     lanczos_tol: Any = default_tol) -> tuple:
    """The operator route's resolved options, ``(k, method, q, tol, limit, block_size, max_basis)``:
    ``method="auto"`` is block Lanczos (rsvd when ``power_iters`` is given), the default pass limit and
    Lanczos block; shared by the run and its plan (:mod:`blocklin.linalg.lowrank.sparse_plan`)."""
    m, n = shape
    k = check_k(k, m, n)  # every triplet (k=None) comes from the whole space, which an operator does not give
    if n_iter is not None:
        power_iters = power_passes(7 if k < 0.1 * min(m, n) else 4) if n_iter == "auto" else power_passes(n_iter)
    method = ("rsvd" if power_iters != "auto" else "lanczos") if method == "auto" else method
    q = (None if tol is not None else auto_power_iters(k, m, n)) if power_iters == "auto" else power_iters
    limit = max_passes or (20 if method == "rsvd" else 60)
    if method == "lanczos" and block_size is None and max_basis is None:  # products cheap per column: a small block
        block_size = sparse_block(k, oversample, min(m, n))
        max_basis = sparse_basis(k, oversample, block_size, min(m, n))
    tol = lanczos_tol(np.dtype(dtype)) if method == "lanczos" and tol is None else tol
    return k, method, q, tol, limit, block_size, max_basis


def _signed_long(f: Factorization, path: Any) -> Factorization:
    """A wide ``A``'s components (the rows of the stored ``Vt``) signed by scikit-learn's rule, in place
    before the commit, and the short ``U`` with them (``k x n``: what PCA loads anyway). Real data only
    (PCA's); complex triplets take their phases from the short factor as it is formed (:func:`run_planned`)."""
    arr = open_zarr(path, mode="r+")
    vt = np.asarray(arr[...])
    d = component_signs(vt.T)
    arr[...] = vt * d[:, None].astype(vt.dtype)
    return dataclasses.replace(f, V=f.V * d)


def _returned(res: SVDResult, vectors: bool | str) -> SVDResult | np.ndarray:
    """What ``return_singular_vectors`` asks for, as ``scipy.sparse.linalg.svds`` returns it."""
    if vectors is False:
        return res.s
    if vectors in ("u", "vh"):  # the factor not asked for is None
        keep = (res.U, res.s, None) if vectors == "u" else (None, res.s, res.Vt)
        return SVDResult(*keep, res.report, mean=res.mean, scale=res.scale, moments=res.moments,
                         scaled=res.scaled_moments, output=res.output)
    return res


#: The fields of a :class:`Factorization` the report carries as they are, in this order: those the
#: method set (not ``None``), and ``scaling`` always (``None``: the data needed no scaling).
REPORTED_FIELDS = ("power_iters", "orth", "lanczos_steps", "restarts", "history", "rayleigh_ritz_width",
                   "sketch_size", "sketch_generator", "phases", "scaling", "fallback", "remeasured")


#: Set by callers that return the singular values as Python floats (:func:`blocklin.norm`,
#: :func:`blocklin.cond`): ``s`` as computed, in float64, never cast to single-precision data's dtype
#: (where it could overflow, or lose digits below its normal range).
FLOAT64_VALUES: contextvars.ContextVar[bool] = contextvars.ContextVar("svd_float64_values", default=False)


@contextlib.contextmanager
def float64_values() -> Iterator[None]:
    """Within the block, :func:`svd` returns its singular values in float64 (:data:`FLOAT64_VALUES`)."""
    token = FLOAT64_VALUES.set(True)
    try:
        yield
    finally:
        FLOAT64_VALUES.reset(token)


@contextlib.contextmanager
def scaled_values() -> Iterator[None]:
    """Within the block, :func:`svd` returns the singular values of its data as scaled to be read, ``2^-e A``
    (``e``: ``report["scaling"]["exponent"]``, 0 where unscaled; :data:`~blocklin.linalg.lowrank.run.SCALED_VALUES`):
    their ratios are exact, where ``s`` multiplied back is rounded for data near the ends of the range."""
    token = SCALED_VALUES.set(True)
    try:
        yield
    finally:
        SCALED_VALUES.reset(token)


def _report(job: Job, plan: SvdPlan, f: Factorization, *, tol: float | None, seed: int, oversample: int,
            center: bool, scale: bool, requested: str, resumed: bool, restored: list[str],
            operator_products: int | None = None) -> dict:
    """The report, with per-triplet residuals; warns when ``tol`` was not reached. ``operator_products``:
    an operator's products, which its warning counts instead of the passes over a stored ``A`` (none)."""
    s = f.s
    check_finite_result("s", s, f"the singular values of svd ({plan.method})")
    if not FLOAT64_VALUES.get():
        check_result_range("a", s, plan.dtype, "singular values")
    s1 = float(s[0]) if s.size and s[0] > 0 else 1.0
    if tol is None and plan.method == "rsvd":
        # a fixed number of power passes is still judged: converged says the residuals met the default tol
        # (without one every triplet had read as converged, relative residuals of 0.07 included)
        tol = default_tol(plan.dtype)
    triplets = triplet_report(s, f.residuals, tol, plan.dtype)
    if f.values_exponent:  # scaled_values: judged on the scaled values (same ratios), reported multiplied back
        s1, triplets = _multiplied_back(s1 if s.size and s[0] > 0 else None, triplets, f.values_exponent)
    # converged only for residuals actually measured: the single-pass sketch has none (None, with its note)
    converged = None if f.residuals is None else all(triplets["converged_triplets"] or [True])
    if f.note:  # converged residuals, values that may still be wrong: said, never reported as converged
        warn(f"svd ({plan.method}): {f.note['note']}", ConvergenceWarning)
    if converged is False:  # beside a note too: the note is about the triplets that converged
        bad = [i + 1 for i, c in enumerate(triplets["converged_triplets"]) if not c]
        w = triplets["worst_triplet"]
        within = (f"{job.passes('a')} passes over A" if operator_products is None
                  else f"{operator_products} products with the operator")
        warn(f"svd ({plan.method}): tol={tol:g} not reached within {within} for triplet(s) "
             f"{bad[:10]}{' ...' if len(bad) > 10 else ''}; worst: triplet {w['index']} (s = {w['s']:.4g}), "
             f"relative residual ||A^T u - s v|| / s = {w['relative_residual']:.2e}. Raise max_passes"
             f"{' or power_iters' if plan.method == 'rsvd' else ''}, or loosen tol", ConvergenceWarning)
    if f.note:
        converged = False
    report = job.report(
        method=plan.method, passes=job.passes("a"), passes_formula=plan.formula, passes_total=job.passes(),
        intermediate_passes=job.passes("intermediate"), **triplets, converged=converged, tol=tol,
        seed=seed, oversample=oversample, block=plan.block, in_core=plan.in_core, plan=plan.to_dict(),
        sigma_max=s1, **{key: getattr(f, key) for key in REPORTED_FIELDS
                         if key == "scaling" or getattr(f, key) is not None})
    if f.note:
        report.update(repeated_beyond_block(f.note))
    if f.residuals is None:
        report["residual_note"] = ("not computed: the single-pass sketch never reads A again; "
                                   "use method='rsvd' or 'lanczos' for residuals")
    elif plan.method == "full":
        report["residual_note"] = ("of the SVD of R, B = Q R (B^T u - s v differs by the QR's backward error, "
                                   "about eps ||A||)")
    report.update(center=center, scale=scale, method_requested=requested, resumed=resumed,
                  restored_checkpoints=restored)
    if f.remeasured:
        report["passes_formula"] = f"{report['passes_formula']} + 1 (residuals measured from A^T u)"
    if f.means_fused:
        report["passes_formula"] = f"{report['passes_formula']} (the column means from the first pass)"
    elif (center or scale) and not plan.in_core:
        report["passes_formula"] = f"{report['passes_formula']} + 1 (column means)"
    return report


def _multiplied_back(s1: float | None, triplets: dict, e: int) -> tuple[float, dict]:
    """``sigma_max`` and the triplets' absolute fields (residuals, the worst triplet's ``s``) of ``2^-e B``
    times ``2^e``, as the report says them without :func:`scaled_values` (beyond float64's range: inf; the
    caller judges the values it returns)."""
    out = dict(triplets)
    if out.get("residuals") is not None:
        out["residuals"] = [unscale_float(r, e) for r in out["residuals"]]
    if out.get("worst_triplet"):
        out["worst_triplet"] = dict(out["worst_triplet"], s=unscale_float(out["worst_triplet"]["s"], e))
    return (unscale_float(s1, e) if s1 is not None else 1.0), out


def _result(job: Job, out: Any, dtype: Any, plan: SvdPlan, f: Factorization, report: dict, ao: Any,
            overwrite: bool, long_wanted: bool = True, kept: tuple | None = None,
            pca: dict | None = None) -> SVDResult:
    """Commit the group (the long factor is already in it) and return ``(U, s, Vt)``; ``kept``: the
    co-moments an update reads and what was factored (:mod:`blocklin.linalg.lowrank.updatable`); ``pca``:
    the PCA's options recorded beside them (:mod:`blocklin.linalg.lowrank.pca_stored`).

    The long factor (``U`` for tall, ``Vt`` for wide ``A``) is always the stored :class:`Matrix`, the
    other factor and ``s`` NumPy arrays, whether ``A`` was factored in memory or streamed; ``None``
    where it was not wanted (``return_singular_vectors``).
    """
    # real: float32 of complex64 data; float64 for callers that return Python floats (norm, cond)
    s = f.s.astype(np.float64 if FLOAT64_VALUES.get() else np.finfo(dtype).dtype)
    spilled = isinstance(f.V, StoredFactor)  # the short factor already in the group (spilled Lanczos bases)
    if spilled:
        small = {"S": s}
    else:
        short = f.V.astype(dtype)  # N x k: V for tall A, U for wide A
        if plan.transposed and short.dtype.kind == "c":  # A^T = conj(V) S U^T: U is the conjugate of B's V
            short = short.conj()
        small = {"S": s, "U": short} if plan.transposed else {"S": s, "Vt": short.conj().T.copy()}
    for name in ("mean", "scale"):
        if getattr(f, name) is not None:
            small[name] = getattr(f, name)
    params = {"pca": pca} if pca is not None else {}
    if kept is not None:
        small.update(kept[0])
        params["update"] = kept[1]
    path = write_group(job, out, None, small, "svd", plan, report, overwrite, ao=ao, params=params or None)
    report["output"] = str(path)
    stored = Matrix(path / ("Vt" if plan.transposed else "U"), report=report, temporary=out is None) \
        if long_wanted else None
    if spilled:  # the short factor as the long one is returned: a Matrix on the group
        small[f.V.name] = Matrix(path / f.V.name, report=report, temporary=out is None)
    elif stored is None and out is None:  # nothing of the temporary group is returned
        remove(path)
    extra = {"mean": f.mean, "scale": f.scale, "moments": f.moments, "scaled": f.scaled_moments}
    if plan.transposed:
        return SVDResult(small["U"], s, stored, report, output=path, **extra)
    return SVDResult(stored, s, small["Vt"], report, output=path, **extra)
