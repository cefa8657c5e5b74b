"""Block Lanczos with thick restart, full reorthogonalization and explicit Rayleigh-Ritz.

One *step* applies the operator to a block of ``b`` orthonormal vectors; on disk that is one pass
over the matrix (for the SVD the fused pass ``Z = B^T (B X)`` of a tall ``B``: block Golub-Kahan
bidiagonalization written one-sided on the normal operator). The basis ``V`` and its image
``W = Op V`` are kept in memory (they live in the short dimension), so the projected matrix
``H = V^T W`` is formed explicitly and every Ritz pair comes with its exact residual
``||Op y - theta y|| = ||W c - theta V c||`` at no extra pass. The next block spans the residuals of
the wanted Ritz pairs orthogonalized twice against ``V`` (block Lanczos / Krylov continuation);
when the basis reaches ``max_basis`` it is thick-restarted to the best Ritz vectors, which keeps
``W = Op V`` exact (Wu and Simon 2000; Baglama and Reichel 2005 for the SVD; Golub and Kahan 1965,
Larsen's PROPACK for reorthogonalized bidiagonalization).

:func:`eigsh` applies it to symmetric matrices (one pass per step, the first one also probing
symmetry).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from blocklin.errors import BlocklinError, ConvergenceWarning, DTypeError, ShapeError, explain, warn
from blocklin.linalg import _svd_kernels as K
from blocklin.linalg.orth import collect_rows, orth_against, reduce_sum, run_pass


class NotSymmetricError(BlocklinError, ValueError):
    """``eigsh`` was given a matrix that is not symmetric."""


@dataclasses.dataclass
class LanczosResult:
    values: np.ndarray      # wanted Ritz values, in "which" order
    vectors: np.ndarray     # n x k Ritz vectors (float64)
    residuals: np.ndarray   # ||Op x - theta x|| per pair
    converged: bool
    steps: int
    restarts: int
    history: list


def _order(theta: np.ndarray, which: str) -> np.ndarray:
    if which == "LA":
        return np.argsort(-theta, kind="stable")
    if which == "SA":
        return np.argsort(theta, kind="stable")
    if which == "LM":
        return np.argsort(-np.abs(theta), kind="stable")
    raise ValueError(which)


def block_lanczos(apply: Callable[[np.ndarray, int], np.ndarray], n: int, k: int, *, which: str, block: int,
                  max_basis: int, max_steps: int, threshold: Callable[[np.ndarray], np.ndarray], seed: int,
                  x0: np.ndarray | None = None, first: np.ndarray | None = None) -> LanczosResult:
    """Thick-restarted block Lanczos (see module docstring).

    Parameters
    ----------
    apply : callable
        ``apply(X, step) -> Op X`` for an ``n x b`` float64 block (one pass on disk).
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
    """
    b = max(1, min(block, n))
    x = orth_against(None, K.gaussian(seed, K.STREAM_LANCZOS, 0, n, b), seed=seed) if x0 is None else x0
    V = np.zeros((n, 0))
    W = np.zeros((n, 0))
    H = np.zeros((0, 0))
    history: list = []
    steps = restarts = 0
    counter = 1
    while True:
        z = np.asarray(first if (first is not None and steps == 0) else apply(x, steps + 1), dtype=np.float64)
        steps += 1
        # extend the projected matrix: H = V^T W with the new columns
        h12 = V.T @ z
        h21 = x.T @ W
        h22 = x.T @ z
        H = np.block([[H, h12], [h21, h22]]) if H.size else h22
        H = (H + H.T) / 2
        V = np.hstack([V, x])
        W = np.hstack([W, z])
        theta, Y = np.linalg.eigh(H)
        order = _order(theta, which)
        kk = min(k, len(theta))
        sel = order[:kk]
        ritz = V @ Y[:, sel]
        res = W @ Y[:, sel] - ritz * theta[sel]
        rn = np.linalg.norm(res, axis=0)
        bound = threshold(theta[sel])
        conv = rn <= bound
        history.append(float(np.max(rn / np.maximum(bound, 1e-300))) if kk else 0.0)
        exhausted = V.shape[1] >= n
        if (kk == k and conv.all()) or exhausted or steps >= max_steps:
            ok = bool(kk == k and (conv.all() or exhausted))
            return LanczosResult(theta[sel], ritz, rn, ok, steps, restarts, history)
        # next block: dominant directions of the residuals of the wanted (+ buffer) pairs
        cand = order[:min(len(order), k + b)]
        rc = W @ Y[:, cand] - (V @ Y[:, cand]) * theta[cand]
        if V.shape[1] + b > max_basis:  # thick restart to the best Ritz vectors (W = Op V stays exact)
            keep = order[:min(len(order), max(k + b, max_basis // 2, k))]
            V = V @ Y[:, keep]
            W = W @ Y[:, keep]
            H = np.diag(theta[keep])
            restarts += 1
        x = orth_against(V, rc, seed=seed, counter=counter)[:, :b]
        counter += 1
        if x.shape[1] == 0:
            return LanczosResult(theta[sel], ritz, rn, bool(conv.all()), steps, restarts, history)


def default_tol(dtype: Any) -> float:
    """Default relative residual tolerance: ``10 sqrt(eps)`` of the dtype."""
    return 10.0 * math.sqrt(float(np.finfo(np.dtype(dtype)).eps))


def symmetry_rtol(dtype: Any) -> float:
    """Relative asymmetry ``||A X - A^T X|| / ||A X||`` tolerated by :func:`eigsh`."""
    return math.sqrt(float(np.finfo(np.dtype(dtype)).eps))


def eigsh(a: Any, k: int, *, which: str = "LA", tol: float | None = None, block_size: int | None = None,
          max_basis: int | None = None, max_passes: int = 60, seed: int | None = None, out: Any = None,
          memory: Any = None, device: str | None = None, scheduler: Any = None, workers: int | None = None,
          progress: Any = None, check_finite: bool | None = None, overwrite: bool = False,
          check_symmetric: bool = True, temp_dir: Any = None, storage_options: dict | None = None) -> Any:
    """``k`` eigenpairs of a symmetric out-of-core matrix by thick-restarted block Lanczos.

    Each Lanczos step is one pass over ``A`` (``Z = A^T X``, equal to ``A X`` for symmetric ``A``).
    The first pass also forms ``A X`` for its random block and compares: a matrix with
    ``||A X - A^T X|| > sqrt(eps) ||A X||`` is refused with :class:`NotSymmetricError` (a sampled
    check: a random block detects any asymmetry with probability one). A matrix that fits the budget
    is read once and solved in memory.

    Parameters
    ----------
    a : path, zarr array, Matrix, NumPy or Dask array
        Symmetric ``n x n``, float32 or float64.
    k : int
        Number of eigenpairs, ``1 <= k < n``.
    which : {"LA", "SA", "LM"}
        Largest algebraic, smallest algebraic, or largest magnitude eigenvalues.
    tol : float, optional
        Converged when ``||A x - lambda x|| <= tol * max|lambda|`` for every pair;
        default ``10 sqrt(eps)`` of the dtype.
    block_size, max_basis : int, optional
        Lanczos block size and the basis size at which it restarts.
    max_passes : int
        Pass limit; a :class:`~blocklin.errors.ConvergenceWarning` says what was reached.
    seed : int, optional
        Seed of the starting block (results are deterministic for a seed).
    out : path, optional
        Write a zarr group with ``w``, ``V`` and the report in its attributes.
    memory, device, scheduler, workers, progress, check_finite, overwrite
        As for every blocklin operation.
    temp_dir : path or URL, optional
        Where staged inputs and intermediates go (default: config / ``BLOCKLIN_TEMP_DIR``).
    storage_options : dict, optional
        fsspec options for URL operands, outputs and temp dir (see ``docs/cluster.md``).

    Returns
    -------
    EighResult
        ``w, V = result`` (eigenvalues ascending, as in SciPy, and eigenvectors ``n x k``), with
        ``result.report``: passes, bytes read, seconds, peak memory, per-pair residuals.

    References
    ----------
    Golub and Underwood (1977), the block Lanczos method; Wu and Simon (2000), thick restart.
    """
    from blocklin.linalg.svd import _check_k, _resolve_seed, _write_group
    from blocklin.plan.svd import plan_svd
    from blocklin.runtime.job import Job

    if which not in ("LA", "SA", "LM"):
        raise ValueError(explain("which", "must be 'LA', 'SA' or 'LM'", repr(which), "pass which='LA'"))
    with Job("eigsh", memory=memory, device=device, scheduler=scheduler, workers=workers, progress=progress,
             check_finite=check_finite, temp_dir=temp_dir, storage_options=storage_options) as job:
        A = job.operand(a, "a")
        n, n2 = A.shape
        if n != n2:
            raise ShapeError(explain("a", "must be square (eigsh needs a symmetric matrix)", f"{n} x {n2}",
                                     "use blocklin.svd for rectangular matrices"))
        if A.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise DTypeError(explain("a", "dtype must be float32 or float64", A.dtype.name,
                                     "convert it (blocklin convert --dtype float64)"))
        _check_k(k, n, n)
        dt = A.dtype
        tol = default_tol(dt) if tol is None else float(tol)
        if not tol > 0:
            raise ValueError(explain("tol", "must be positive", repr(tol), "pass tol=1e-6"))
        seed = _resolve_seed(seed)
        plan = plan_svd(n, n, k, dt, method="eigsh", oversample=10, power_iters=None, memory=job.cfg.memory,
                        max_passes=max_passes, block_size=block_size, max_basis=max_basis, square=True)
        passes = {"a": 0}
        b = plan.block
        x0 = orth_against(None, K.gaussian(seed, K.STREAM_LANCZOS, 0, n, b), seed=seed)
        rtol = symmetry_rtol(dt)

        if plan.in_core:
            from blocklin.linalg.svd import _load

            M = _load(job, A, False, plan)
            passes["a"] = 1
            ax = M @ x0.astype(dt)
            atx = M.T @ x0.astype(dt)
            first = atx

            def apply(x: np.ndarray, step: int) -> np.ndarray:
                return (M.T @ x.astype(dt)).astype(np.float64)
        else:
            def one(x: np.ndarray, step: int, check: bool = False) -> Any:
                passes["a"] += 1
                states, _ = run_pass(job, "rmat", inputs=(A.path,), kernel=K.rmat_kernel, init=K.rmat_init,
                                     params={"Y": x.astype(dt), "n": n, "check": check}, M=n, N=n, c=x.shape[1],
                                     dtype=dt, chunk_rows=A.chunks[0], memory=plan.pass_memory,
                                     chunk_bytes=int(np.prod(A.chunks)) * dt.itemsize, chunks_across=-(-n // A.chunks[1]),
                                     description=f"eigsh: Lanczos step {step}")
                z = reduce_sum(states, "Z")
                return (z, collect_rows(states, n, x.shape[1])) if check else z

            atx, ax = one(x0, 1, check=check_symmetric)
            first = atx
            apply = one
        if check_symmetric:
            ax = np.asarray(ax, dtype=np.float64)
            diff = float(np.linalg.norm(ax - np.asarray(atx, dtype=np.float64)))
            size = float(np.linalg.norm(ax)) or 1.0
            if diff > rtol * size:
                raise NotSymmetricError(explain(
                    "a", "must be symmetric for eigsh (checked on a random block: ||A X - A^T X|| <= "
                    f"{rtol:.1e} ||A X||)", f"relative asymmetry {diff / size:.2e}",
                    "symmetrize it ((A + A^T)/2), or use blocklin.svd for a non-symmetric matrix"))

        scale = {"v": 0.0}

        def threshold(theta: np.ndarray) -> np.ndarray:
            scale["v"] = max(scale["v"], float(np.max(np.abs(theta))) if theta.size else 0.0)
            return np.full(theta.shape, tol * max(scale["v"], np.finfo(np.float64).tiny))

        steps_limit = max_passes if not plan.in_core else max(max_passes, 500)
        res = block_lanczos(apply, n, k, which=which, block=b, max_basis=plan.max_basis, max_steps=steps_limit,
                            threshold=threshold, seed=seed, x0=x0, first=first)
        if not res.converged:
            warn(f"eigsh: tol={tol:g} not reached within {passes['a']} passes over A; reached a relative residual "
                 f"of {float(np.max(res.residuals)) / max(scale['v'], 1e-300):.2e} (max over the {k} pairs). Raise "
                 "max_passes, max_basis or block_size, or loosen tol", ConvergenceWarning)
        order = np.argsort(res.values, kind="stable")
        w = res.values[order].astype(dt)
        vecs = res.vectors[:, order].astype(dt)
        resid = res.residuals[order]
        report = job.report(passes=passes["a"], passes_formula=plan.formula, lanczos_steps=res.steps,
                            restarts=res.restarts, residuals=resid.tolist(), tol=tol, converged=res.converged,
                            which=which, seed=seed, block=b, history=res.history, in_core=plan.in_core,
                            plan=plan.to_dict())
        if out is not None:
            _write_group(job, out, A, {"w": w, "V": vecs}, "eigsh", plan, report, overwrite)
        return EighResult(w, vecs, report)


class EighResult(tuple):
    """``(w, V)`` with a ``report`` attribute."""

    def __new__(cls, w: np.ndarray, V: np.ndarray, report: dict) -> EighResult:
        obj = super().__new__(cls, (w, V))
        obj.report = report
        return obj

    @property
    def w(self) -> np.ndarray:
        return self[0]

    @property
    def V(self) -> np.ndarray:
        return self[1]
