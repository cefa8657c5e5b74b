"""Block Lanczos with thick restart, full reorthogonalization and explicit Rayleigh-Ritz.

One *step* applies the operator to a block of ``b`` orthonormal vectors; on disk that is one pass
over the matrix (for the SVD the fused pass ``Z = B^T (B X)`` of a tall ``B``: block Golub-Kahan
bidiagonalization written one-sided on the normal operator). The basis ``V`` and its image
``W = Op V`` (allocated to the largest basis, each step appending its block) live in fixed row strips,
in memory or spilled to scratch files where the caller's budget asks (:mod:`blocklin.linalg.lowrank.basis`:
the same strip-by-strip products either way, so the same bits), and the projected matrix ``H = V^H W``
is formed explicitly.
The block Lanczos relation ``W = V H + [0 .. 0, (I - V V^H) z]`` (``z`` the step's image; thick restarts
keep it, Wu and Simon 2000) gives every Ritz pair's residual norm as ``||T y_b||``, ``T`` the R factor
of ``z``'s projection and ``y_b`` the pair's last coordinates, with no ``n``-long work; the Ritz vectors
and their explicit residuals ``||W c - theta V c||`` are formed only when those estimates say every
wanted pair may have converged (or at the last step), and only the explicit residuals decide. The
step's image is projected first against the blocks it couples with in exact arithmetic (the previous
block and its own: the block three-term recurrence; after a thick restart, every kept vector), in the
read that also forms its components along the whole basis (Golub and Underwood 1977 for the block
recurrence), then once against the whole basis (full reorthogonalization: Golub and Van Loan, *Matrix
Computations*), and again only where the Kahan-Parlett test says that pass lost orthogonality
(:func:`~blocklin.linalg.blocks.orth.reorthogonalize`): two reads of ``V`` a step, where classical
Gram-Schmidt twice against the whole basis took four. The next block is the dominant directions
of the projected block (:func:`~blocklin.linalg.blocks.orth.next_block`). When the basis
reaches ``max_basis`` it is thick-restarted to the best Ritz vectors, which keeps ``W = Op V`` exact
(Wu and Simon 2000; Baglama and Reichel 2005 for the SVD; Golub and Kahan 1965, Larsen's PROPACK for
reorthogonalized bidiagonalization).

:func:`blocklin.linalg.lowrank.eigsh.eigsh` applies it to symmetric matrices (one pass per step, the first one
also probing symmetry); :func:`blocklin.svd` to the normal operator of a tall matrix.

A complex (Hermitian) operator takes the same steps in complex128 with ``H = V^H W`` Hermitian, whose
eigenvalues are real (the Hermitian Lanczos process; ARPACK's ``znaupd`` and LAPACK's ``zheev`` conventions).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.linalg

from blocklin._blas import blas_threads
from blocklin._memory import reused_allocations
from blocklin.errors import ParameterError, explain
from blocklin.linalg.blocks.orth import ct, next_block, orth_against, reorthogonalize, tall_qr, work_dtype
from blocklin.linalg.blocks.random import STREAM_LANCZOS, gaussian
from blocklin.linalg.lowrank.basis import Basis, Columns, memory_bases, residual_columns, ritz_residuals


@dataclasses.dataclass
class LanczosResult:
    values: np.ndarray      # wanted Ritz values, in "which" order
    vectors: np.ndarray     # n x k Ritz vectors (float64, or complex128)
    residuals: np.ndarray   # ||Op x - theta x|| per pair
    converged: bool
    steps: int
    restarts: int
    history: list
    #: ``Op x - theta x`` of the returned pairs (n x k): the directions a final Rayleigh-Ritz step can add
    residual_vectors: np.ndarray | None = None
    #: A value found as often as the block is wide, with wanted values after it (:func:`full_block_cluster`):
    #: why pairs whose residuals converged are not reported as converged
    repeated: dict | None = None
    #: Whether every pair's residual met its bound (``converged`` also needs ``repeated`` to be ``None``)
    residuals_converged: bool | None = None

    @property
    def note(self) -> str | None:
        return self.repeated["note"] if self.repeated else None


def _order(theta: np.ndarray, which: str) -> np.ndarray:
    if which == "LA":
        return np.argsort(-theta, kind="stable")
    if which == "SA":
        return np.argsort(theta, kind="stable")
    if which == "LM":
        return np.argsort(-np.abs(theta), kind="stable")
    raise ParameterError(explain("which", "must be 'LA', 'SA' or 'LM'", repr(which), "pass which='LA'"))


def _reusing_step_temporaries(fn: Callable) -> Callable:
    """Run ``fn`` with the allocations of its steps reused from the heap, up to the size the running
    job's budget allows (:func:`blocklin._memory.reused_allocations`): every step makes and frees the
    same ``n x block`` temporaries."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        from blocklin.runtime.job import current_job

        job = current_job()
        with reused_allocations(job.cfg.memory if job is not None else None):
            return fn(*args, **kwargs)

    return run


@_reusing_step_temporaries
def block_lanczos(apply: Callable[[np.ndarray, int], np.ndarray], n: int, k: int, *, which: str, block: int,
                  max_basis: int, max_steps: int, threshold: Callable[[np.ndarray], np.ndarray], seed: int,
                  x0: np.ndarray | None = None, first: np.ndarray | None = None,
                  checkpoint: Callable[[dict], None] | None = None, state: dict | None = None,
                  dtype: Any = np.float64, bases: Callable[[int, int, Any], tuple[Basis, Basis]] | None = None
                  ) -> LanczosResult:
    """Thick-restarted block Lanczos (see module docstring).

    Parameters
    ----------
    apply : callable
        ``apply(X, step) -> Op X`` for an ``n x b`` float64 (complex128) block (one pass on disk).
    n, k : int
        Dimension and wanted pairs.
    which : {"LA", "SA", "LM"}
    block, max_basis, max_steps : int
        Block size, basis size that triggers a thick restart, and the step limit.
    threshold : callable
        ``threshold(theta_wanted) -> per-pair residual bound``.
    seed : int
        Seed of the starting block (counter-based).
    x0, first : ndarray, optional
        A starting block and its image, when the caller already computed them.
    checkpoint : callable, optional
        ``checkpoint(state)`` after every step that continues: the whole iteration state (arrays and
        counters) from which ``state=`` resumes it exactly.
    state : dict, optional
        A state saved by ``checkpoint``: continue from it instead of starting.
    dtype : dtype
        The operator's: a complex one is Hermitian, and the bases are complex128.
    bases : callable, optional
        ``bases(n, cap, dtype) -> (V, W)``: where the bases live (:mod:`~blocklin.linalg.lowrank.basis`;
        default in memory). Spilled bases return the Ritz vectors and their residual vectors as
        :class:`~blocklin.linalg.lowrank.basis.Columns` of the bases, never held in memory.
    """
    b = max(1, min(block, n))
    wd = work_dtype(dtype)
    keep_max = max(k + b, max_basis // 2, k)
    cap = basis_columns(n, k, b, max_basis)  # the basis never grows past a restart's kept part plus a block
    if state is not None:
        x, v0, w0, H = (np.asarray(state[key], dtype=wd) for key in ("x", "V", "W", "H"))
        history = [float(h) for h in np.atleast_1d(state["history"])]
        steps, restarts, counter = (int(state[key]) for key in ("steps", "restarts", "counter"))
    else:
        x = start_block(n, block, seed, dtype=wd) if x0 is None else x0
        v0, w0, H = None, None, np.zeros((0, 0), dtype=wd)
        history, steps, restarts, counter = [], 0, 0, 1
    # the first column of the blocks the next step's image couples with (x's alone at the start; every kept
    # vector after a restart): its first projection's window
    local = int(state.get("local", 0)) if state is not None else 0
    x0 = None  # the block is x's alone: dropped once it is in the basis
    m = 0 if v0 is None else v0.shape[1]
    cap = max(cap, m + x.shape[1])
    # the bases (columns [:m] in use), in memory or spilled (basis.py): a step appends its block, strip by strip
    V, W = (bases or memory_bases)(n, cap, wd)
    V.threads = W.threads = basis_threads()
    if m:
        V.append(v0)
        W.append(w0)
    del v0, w0
    eps = float(np.finfo(np.float64).eps)
    while True:
        owned = not (first is not None and steps == 0)  # the caller's first image is not overwritten
        z = np.asarray(first if not owned else apply(x, steps + 1), dtype=wd)
        first = None
        steps += 1
        bx = x.shape[1]
        with small_blas(n, cap):  # the in-memory work of the step
            V.append(x)
            W.append(z)
            m += bx
            del x
            # z's projection: first against the blocks it couples with in exact arithmetic (the previous
            # block and x; after a restart every kept vector), in the read that then forms V^H y for the
            # projection against the whole basis (reorthogonalize)
            lo = min(local, m - bx)
            c_loc = V.dot(z, lo)
            y, c2, g = V.subtract_dot(z if owned and z.flags.writeable else z.copy(), c_loc, lo)
            del z
            # the norm of the block the last pass against V was applied to (at most y's before it): that pass
            # leaves components along V of about u times it, which normalizing y's weakest direction amplifies
            y_norm = math.sqrt(max(float(np.linalg.eigvalsh((g + ct(g)) / 2)[-1]), 0.0)) if g.size else 0.0
            y, g = reorthogonalize(V, y, c2, g)
            # the new column of H = V^H W: the recurrence's coefficients (the window's), as a Lanczos run
            # with full reorthogonalization keeps them (Parlett); adding the reorthogonalization's own
            # coefficients stalled a fast-decaying spectrum at 1.5x its bound (tests/lowrank/test_svd.py)
            c = np.zeros_like(c2)
            c[lo:] = c_loc
            h12, h22 = c[:m - bx], c[m - bx:]
            h22 = (h22 + ct(h22)) / 2
            H = np.block([[H, h12], [ct(h12), h22]]) if m > bx else h22
            c = np.concatenate([h12, h22])
            # W - V H = [0 .. 0, (I - V V^H) z] (the Krylov relation, kept by thick restarts): the residual of
            # every Ritz pair comes from z's projection, whose R factor gives its norm without n-long work
            q1, t = tall_qr(y, g)
            del y, g, c2, c_loc
            norm_z = float(np.linalg.norm(np.concatenate([c, t]), 2))
            with blas_threads(1):  # an eigh of at most a few hundred rows: threads only spin
                theta, Y = np.linalg.eigh(H)
            order = _order(theta, which)
            kk = min(k, len(theta))
            sel = order[:kk]
            bound = threshold(theta[sel])
            est = np.linalg.norm(t @ Y[m - bx:m, sel], axis=0)
            # the estimate misses rounding (about u sqrt(m) ||Op||) and dropped directions: a gate only, the
            # explicit residual decides
            slack = 100 * eps * math.sqrt(m) * float(np.max(np.abs(theta), initial=0.0))
            exhausted = m >= n
            last = exhausted or steps >= max_steps
            if last or (kk == k and np.all(est <= bound + slack)):
                rn, ritz, res = ritz_residuals(V, W, Y[:, sel], theta[sel], keep=not V.spilled)
                conv = rn <= bound
                history.append(float(np.max(rn / np.maximum(bound, 1e-300))) if kk else 0.0)
                if (kk == k and conv.all()) or last:
                    # an exhausted Krylov space is converged, but never with a NaN residual (never checked)
                    ok = bool(kk == k and (conv.all() or (exhausted and np.isfinite(rn).all())))
                    repeated = None if exhausted else full_block_cluster(theta[sel], rn, b, conv)
                    out = _result(V, W, Y[:, sel], theta[sel], rn, ok and repeated is None, steps, restarts,
                                  history, ritz, res)
                    return dataclasses.replace(out, repeated=repeated, residuals_converged=ok)
                del ritz, res
            else:
                history.append(float(np.max(est / np.maximum(bound, 1e-300))) if kk else 0.0)
            restart = m + b > max_basis
            keep = order[:min(len(order), keep_max)] if restart else None
            if n - (len(keep) if restart else m) <= 0:  # no direction left outside the basis: the pairs as they stand
                rn, ritz, res = ritz_residuals(V, W, Y[:, sel], theta[sel], keep=not V.spilled)
                ok = bool(kk == k and (rn <= bound).all())
                return dataclasses.replace(_result(V, W, Y[:, sel], theta[sel], rn, ok, steps, restarts, history,
                                                   ritz, res), residuals_converged=ok)
            if restart:  # thick restart to the best Ritz vectors (W = Op V stays exact)
                V.restart(Y[:, keep])
                W.restart(Y[:, keep])
                H = np.diag(theta[keep]).astype(wd)
                m = len(keep)
                restarts += 1
            # the next block: the dominant directions of the residual space, orthogonal to the (kept) basis
            x = next_block(V, q1, t, norm_z=norm_z, seed=seed, counter=counter, width=b, projected=True)
            x = _keep_orthogonal(V, x, t, y_norm, b)
            del q1
            counter += 1
            local = 0 if restart else m - bx
            if checkpoint is not None:
                checkpoint({"x": x, "V": V.to_numpy(), "W": W.to_numpy(), "H": H, "history": np.array(history),
                            "steps": steps, "restarts": restarts, "counter": counter, "local": local})


def check_basis_reaches_k(k: int, block: int, max_steps: int, n: int, found: int | None = None) -> None:
    """Refuse a step limit at which the basis of an eigensolver holds fewer than ``k`` vectors (``max_steps``
    blocks of ``block``), so fewer than ``k`` Ritz pairs: ``eigsh`` had returned the pairs it had (``V`` of 60
    columns for ``k = 70``) under a warning that named a repeated eigenvalue. ``found``: the pairs a run
    returned (a :class:`~blocklin.errors.ConvergenceError` when fewer than ``k``). The SVD needs no such
    check: its Rayleigh-Ritz step over the Ritz and residual vectors gives ``k`` triplets from any basis."""
    from blocklin.errors import ConvergenceError

    b = max(1, min(block, n))
    basis = max_steps * b if found is None else found
    if basis >= k:
        return
    need = -(-k // b)  # steps whose blocks reach k vectors; converging takes more
    raise (ParameterError if found is None else ConvergenceError)(explain(
        "max_passes", f"must let the Lanczos basis reach k = {k} vectors (each step, one pass, adds a block of {b})",
        f"a limit of {max_steps} steps, {basis} Ritz pairs",
        f"pass max_passes well above {need} (a few times {need} to converge), or a larger block_size (at least "
        f"{-(-k // max_steps)} for {max_steps} steps)"))


#: Growth ``||y_prev|| / s_min`` above which :func:`_keep_orthogonal` projects the next block once more: the
#: block then stays orthogonal to the basis to about this many rounding units (rather than ``u ||y_prev|| / s_min``).
REPROJECT_GROWTH = 16.0


def _keep_orthogonal(V: Any, x: np.ndarray, t: np.ndarray, y_norm: float, width: int,
                     drop: float = 1e-10) -> np.ndarray:
    """The next block ``x`` (orthonormal, from the projected block ``y = Q1 T``), projected against ``V``
    once more where normalizing ``y`` amplified the rounding its last projection left along ``V``.

    Block classical Gram-Schmidt twice keeps the *block* ``y`` orthogonal to ``V`` to about ``u ||y_prev||``
    (``y_prev`` the block the last pass was applied to), but the next block is ``y`` normalized, each
    direction divided by its singular value: the leftover grows to ``u ||y_prev|| / s_min``, ``s_min`` the
    smallest kept singular value of ``T`` (Barlow and Smoktunowicz 2013, "Reorthogonalized block classical
    Gram-Schmidt", Numer. Math. 123: the second pass must act on the normalized block). That is
    ``u cond(y)``, and a matrix with one dominant singular value ``s_1`` gives a first block with
    ``cond(y)`` near ``(s_1 / s_2)^2`` on the normal operator: ``V^T V - I`` was ``1e-9`` to ``1e-8`` for a column mean
    of ``1e3`` over a spread of 1. Where that growth exceeds :data:`REPROJECT_GROWTH`, the orthonormal
    ``x`` is projected again (its components along ``V`` are at most ``u`` times the growth, so one more
    pass leaves ``u``; a second only where the first still took most of a direction) and
    re-orthonormalized: two more reads of ``V`` on such steps only."""
    if V.shape[1] == 0 or x.shape[1] == 0:
        return x
    s = scipy.linalg.svd(t, compute_uv=False, check_finite=False)
    scale = float(np.linalg.norm(t, axis=0).max(initial=0.0)) or 1.0
    good = s[s > drop * scale][:width]
    if good.size and y_norm <= REPROJECT_GROWTH * float(good.min()):
        return x
    x = np.array(x, dtype=x.dtype, copy=True) if not x.flags.writeable else x
    for _ in range(2):
        V.project_out(x)
        x, r = tall_qr(x)
        if float(np.abs(np.diag(r)).min(initial=1.0)) * math.sqrt(2.0) >= 1.0:
            break
    return x


def full_block_cluster(theta: np.ndarray, rn: np.ndarray, block: int,
                       converged: np.ndarray | None = None) -> dict | None:
    """Why converged Ritz pairs may still be wrong, or ``None``: a value found ``block`` times or more
    with wanted values after it (``value``, ``count``, ``block`` and the ``note`` that says so).

    A block Krylov space ``K(Op, X)`` holds at most ``b`` independent vectors of any eigenspace (the
    eigenspace's part of ``Op^i X`` is ``lambda^i`` times that of ``X``, ``b`` columns), so block Lanczos
    finds at most ``b`` copies of a repeated eigenvalue (Golub and Underwood 1977), each with a converged
    residual; the copies it cannot find are replaced by the next values, which are then wrong with
    converged residuals. Ritz values within their residuals of one another (``|theta_i - theta_j| <=
    2 (r_i + r_j)``, the Bauer-Fike bound of each, and rounding) count as one value; ``theta`` is in the
    wanted order (copies adjacent). Fewer than ``b`` copies are all of them (the start block is random);
    ``b`` copies at the end of the wanted values displace nothing.

    ``converged``: which pairs met their bound. A value counts as found only with a converged residual:
    an unconverged pair is no eigenvalue yet, and large residuals would merge distinct Ritz values into
    one (a run stopped at ``max_passes`` with residuals near 0.1 had been said to find 1.939 four times,
    for the Ritz values 1.939, 1.934, 1.676, 1.662, and its non-convergence left unsaid). The note says
    whether the values after the copies converged."""
    k = theta.size
    if block >= k:
        return None
    conv = np.ones(k, dtype=bool) if converged is None else np.asarray(converged, dtype=bool)
    slack = 64 * float(np.finfo(np.float64).eps) * float(np.max(np.abs(theta), initial=0.0))
    i = 0
    while i < k:
        j = i
        while (conv[i] and j + 1 < k and conv[j + 1]
               and abs(theta[j + 1] - theta[i]) <= 2 * (rn[j + 1] + rn[i]) + slack):
            j += 1
        if conv[i] and j - i + 1 >= block and j < k - 1:
            count = j - i + 1
            after = ("although their residuals converged" if conv[j + 1:].all()
                     else "(not all of their residuals converged either)")
            return {"value": float(theta[i]), "count": count, "block": block, "note": (
                f"the value {theta[i]:.6g} was found {count} times, as many as the Lanczos block holds ({block}): a "
                f"block finds at most that many copies of a repeated eigenvalue, so it may repeat more often and "
                f"the {k - 1 - j} value(s) after it may be wrong {after} (Golub and "
                f"Underwood 1977); pass block_size={2 * count} or more")}
        i = j + 1
    return None


def repeated_beyond_block(found: dict) -> dict:
    """The report's entries for a :func:`full_block_cluster` finding, on every route that runs block
    Lanczos: ``repeated_beyond_block`` (``value``, ``count``, ``block``) and its ``note``."""
    return {"repeated_beyond_block": {k: found[k] for k in ("value", "count", "block")}, "note": found["note"]}


#: Most reruns with a block twice as wide that :func:`rerun_wider_block` makes.
WIDER_BLOCK_RERUNS = 3


def rerun_wider_block(fn: Callable) -> Callable:
    """``fn`` (:func:`blocklin.eigsh`, :func:`blocklin.svd`) run again with ``block_size`` twice the copies
    found where its report says a value was found as often as the Lanczos block is wide
    (``repeated_beyond_block``, :func:`full_block_cluster`) and the caller left ``block_size`` to the
    planner: a block of ``2 c`` finds more copies than ``c`` where there are. Up to
    :data:`WIDER_BLOCK_RERUNS` times, while the wider block plans within the budget (a refusal keeps the
    last result, with its warning); ``report["block_widened"]`` lists the runs' blocks. Not with
    ``resume`` (the checkpoints are a block's) or a ``block_size`` given. The warnings of a run that is
    replaced are dropped; the kept run's are emitted."""
    import functools
    import warnings

    from blocklin.errors import BudgetError

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("block_size") is not None or kwargs.get("resume"):
            return fn(*args, **kwargs)
        widened: list[dict] = []
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            res = fn(*args, **kwargs)
        while len(widened) < WIDER_BLOCK_RERUNS:
            found = (getattr(res, "report", None) or {}).get("repeated_beyond_block")
            if not found:
                break
            again = {**kwargs, "block_size": 2 * found["count"]}
            if kwargs.get("out") is not None:  # the output this call has just written: replaced
                again["overwrite"] = True
            try:
                with warnings.catch_warnings(record=True) as wider:
                    warnings.simplefilter("always")
                    out = fn(*args, **again)
            except BudgetError:  # the wider block does not fit the budget: the warning stands
                break
            widened.append({k: found[k] for k in ("value", "count", "block")})
            res, seen = out, wider
        for w in seen:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        if widened:
            res.report["block_widened"] = widened
        return res

    return run


def basis_threads() -> int:
    """Threads for the strips of the bases' products (:meth:`~blocklin.linalg.lowrank.basis.Basis.map_strips`:
    the same bits on any number): the running job's local cores (its ``workers`` setting where given), one
    on the ``sync`` scheduler or outside a job."""
    import os

    from blocklin.runtime.job import current_job

    job = current_job()
    if job is None or job.scheduler.kind == "sync":
        return 1
    cores = os.cpu_count() or 1
    local = job.cfg.workers if job.scheduler.kind != "distributed" and job.cfg.workers else cores
    return max(1, min(cores, local))


def basis_columns(n: int, k: int, block: int, max_basis: int) -> int:
    """Columns of each basis :func:`block_lanczos` allocates: the largest basis (``max_basis``, or a thick
    restart's kept part) plus a block, at most ``n``."""
    b = max(1, min(block, n))
    keep_max = max(k + b, max_basis // 2, k)
    return min(n, max(max_basis, keep_max) + b)


def _result(V: Basis, W: Basis, y: np.ndarray, theta: np.ndarray, rn: np.ndarray, ok: bool, steps: int,
            restarts: int, history: list, ritz: np.ndarray | None, res: np.ndarray | None) -> LanczosResult:
    """The returned pairs: in memory as :func:`ritz_residuals` formed them, or, from spilled bases, the
    bases restarted in place to the Ritz vectors and their residual vectors (the same bits, strip by strip)
    and returned as :class:`~blocklin.linalg.lowrank.basis.Columns`."""
    if ritz is None:
        V.restart(y)
        W.restart(y)
        residual_columns(V, W, theta)
        ritz, res = Columns(V, y.shape[1]), Columns(W, y.shape[1])
    return LanczosResult(theta, ritz, rn, ok, steps, restarts, history, res)


#: Elements of an ``n x cols`` block below which the in-memory work runs on one BLAS thread.
SMALL_BLAS_ELEMENTS = 1 << 24


def small_blas(n: int, cols: int) -> contextlib.AbstractContextManager:
    """One BLAS thread for in-memory work on ``n x cols`` blocks of up to :data:`SMALL_BLAS_ELEMENTS`.

    Threads only add synchronization to products, QR, SVD and eigh this small, and on a busy machine
    they spin: QR, SVD and eigh of a 500 x 60 block took 75x longer on 2 threads than on one with
    other jobs running (0.75 s against 0.01 s). A Lanczos step's products on a ``10^5 x 105`` basis
    gain little more from two threads than they lose to the spinning: the sparse svd of issue 29
    (``k = 20``, 19 passes) took 17.0 and 19.5 s on one thread against 35.3 s on two (load average 3.4-4.3,
    two cores), hence ``2^24`` elements (128 MiB of float64). The rule depends on the sizes only, not on
    the budget or the scheduler.
    """
    if n * cols > SMALL_BLAS_ELEMENTS:
        return contextlib.nullcontext()
    return blas_threads(1)


def start_block(n: int, block: int, seed: int, v0: np.ndarray | None = None, dtype: Any = np.float64) -> np.ndarray:
    """The orthonormal starting block of :func:`block_lanczos` (``n x min(block, n)``) for ``seed``;
    ``v0`` (SciPy's starting vector) takes the place of its first random column. Complex ``dtype``: a
    complex Gaussian block."""
    g = gaussian(seed, STREAM_LANCZOS, 0, n, max(1, min(block, n)), work_dtype(dtype))
    if v0 is not None:
        g[:, 0] = v0
    with small_blas(n, block):
        return orth_against(None, g, seed=seed)


def default_tol(dtype: Any) -> float:
    """Default relative residual tolerance: ``10 sqrt(eps)`` of the dtype."""
    return 10.0 * math.sqrt(float(np.finfo(np.dtype(dtype)).eps))
