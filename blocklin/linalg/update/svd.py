"""A truncated SVD (or PCA) brought up to date after rows were appended, from the new rows alone.

A result computed with ``updatable=True`` keeps the co-moments of ``A`` (count ``m0``, means
``mu0``, centered Gram ``C0``: :mod:`blocklin.linalg.lowrank.updatable`). The update

1. reads the ``p`` new rows ``P`` once (of a stored sparse matrix, in dense strips:
   :mod:`blocklin.linalg.lowrank.sparse_comoments`): their count, means and centered Gram, merged into the kept
   ones by Chan, Golub and LeVeque's pairwise update (exact sums: the co-moments of the whole grown
   matrix ``A``, whatever the size of the means);
2. forms the Gram of what was factored, ``B = (A - 1 s^T) D^-1`` (``s = mu`` when centered, ``D``
   the column standard deviations when scaled), ``B^T B = D^-1 (C + m (mu - s)(mu - s)^T) D^-1``,
   and takes its top ``k`` eigenpairs: ``V`` and ``s_i = sqrt(lambda_i)``, the right singular
   vectors and values of the grown matrix (the Gram route of :func:`blocklin.svd`, exact up to the
   Gram's rounding);
3. writes the long factor ``U = B V S^-1`` without reading the old rows of ``A``: for them
   ``B_old V S^-1 = U0 (S0 V0^T D0 D^-1 V S^-1) + 1 c^T + E0 D0 D^-1 V S^-1``, with ``c`` the change of
   the shift and ``E0 = B0 (I - V0 V0^T)`` what the old factors left out. ``U0`` holds
   ``B0 V0 S0^-1`` (every method's Rayleigh-Ritz step), so ``E0^T E0 = (I - P0) B0^T B0 (I - P0)``
   comes from the kept co-moments, and so does the error of each column of ``U``'s old rows,
   ``||E0 w_i|| / s_i`` (reported as ``u_errors``); the new rows are ``(P - 1 s^T) D^-1 V S^-1``.
   Where an old row's error would exceed ``tol`` (the new rows turned the subspace by more than
   the old factors resolve), ``U = B V S^-1`` is written from every row of ``A`` instead: one pass,
   against the several of a recompute, since ``V`` and ``S`` are those of the grown matrix anyway.

A singular value the updated Gram cannot tell from zero (its eigenvalue within the Gram's rounding
``m eps ||B||_F^2``) has for its column of ``U`` an orthonormal completion in :func:`blocklin.svd`
(:mod:`blocklin.linalg.blocks.complete`): vectors orthogonal to ``range(A)`` over every row, which the
new rows alone do not give (``B V S^-1`` is ``0 / 0`` there). The update then recomputes (one full run
with the result's seed: the completion :func:`blocklin.svd` writes, the same bits on every scheduler
and budget; the report says why).

Each triplet's residual ``||B^T u - s v||`` (with ``u = B v / s``: ``||(B^T B v - s^2 v)|| / s``) comes
from the updated Gram, plus its rounding (``m eps ||B||_F^2 / s``). Where a residual misses ``tol``
(singular values near the Gram's rounding), the result is recomputed instead (one full run; the
report says why).

References
----------
M. Brand, "Fast low-rank modifications of the thin singular value decomposition", Linear Algebra
Appl. 415, 2006 (the update of the thin SVD by appended rows).
T. F. Chan, G. H. Golub, R. J. LeVeque, "Algorithms for computing the sample variance: analysis and
recommendations", The American Statistician 37(3), 1983 (the merge of co-moments).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import scipy.linalg

from blocklin.errors import ParameterError, explain
from blocklin.linalg.blocks.center import Moments, merge_comoments, moments_and_gram
from blocklin.linalg.blocks.results import GROUP_REPORT_KEYS
from blocklin.linalg.lowrank.methods import component_signs
from blocklin.linalg.lowrank.run import check_standardizable
from blocklin.linalg.lowrank.sparse_comoments import sparse_comoments
from blocklin.linalg.lowrank.svd import SVDResult
from blocklin.linalg.lowrank.svd_tolerance import default_tol
from blocklin.linalg.lowrank.triplets import triplet_report
from blocklin.linalg.lowrank.updatable import COMOMENTS, MEAN
from blocklin.linalg.update.bands import copy_rows, write_affine
from blocklin.matrix import Matrix
from blocklin.operands import row_range
from blocklin.runtime.job import Job
from blocklin.storage import create_group, write_array
from blocklin.storage.identity import resume_token
from blocklin.sparse import SparseMatrix
from blocklin.storage.location import Location, as_location
from blocklin.storage.sparse import is_sparse
from blocklin.storage.versions import Growth
from blocklin.storage.zarr_store import open_zarr


@dataclasses.dataclass(frozen=True)
class Recompute:
    """An update that could not meet ``tol``: the result is recomputed (``why`` goes in the report)."""

    why: str


@dataclasses.dataclass
class _Stored:
    """The old result's arrays (small ones in memory) and what was factored."""

    S: np.ndarray
    V: np.ndarray
    C: np.ndarray
    mean: np.ndarray
    params: dict
    U: Any  # the stored long factor (zarr array), or None when it was not kept
    dtype: np.dtype


def _open(out: Location, params: dict) -> _Stored:
    upd = params.get("update")
    if not isinstance(upd, dict):
        raise ParameterError(explain("out", "must be an svd/pca result computed with updatable=True (it keeps the "
                                     "co-moments an update reads)", f"{out.url}, computed without them",
                                     "recompute it with updatable=True (--updatable) and --overwrite"))
    s = np.asarray(open_zarr(out / "S"))
    vt = open_zarr(out / "Vt")
    u = None
    try:
        u = open_zarr(out / "U")
    except (FileNotFoundError, OSError):
        u = None  # return_singular_vectors without U: none to update
    wide = np.complex128 if np.dtype(vt.dtype).kind == "c" else np.float64
    return _Stored(S=s.astype(np.float64), V=np.asarray(vt, dtype=wide).conj().T,  # V = Vt^H
                   C=np.asarray(open_zarr(out / COMOMENTS)), mean=np.asarray(open_zarr(out / MEAN)),
                   params=upd, U=u, dtype=np.dtype(vt.dtype))


def _sd(c: np.ndarray, m: int, mean: np.ndarray) -> np.ndarray:
    """Population standard deviations from co-moments, 1 for a constant column (as the svd's scaling,
    :func:`~blocklin.linalg.blocks.center.constant_columns`)."""
    return Moments(mean, np.maximum(np.diag(c).real, 0.0) / max(m, 1), m).std


def _factored_gram(c: np.ndarray, m: int, mean: np.ndarray, center: bool, scale: bool) -> tuple:
    """``B^T B`` of ``B = (A - 1 s^T) D^-1``, with ``s`` and ``D`` (ones where not scaled)."""
    shift = mean if center else np.zeros_like(mean)
    # A^T A = C + m mu mu^T (A^H A = C + m conj(mu) mu^T of complex data): a sum, no cancellation
    g = c.copy() if center else c + m * np.outer(np.conjugate(mean), mean)
    d = _sd(c, m, mean) if scale else np.ones_like(mean)
    if scale:
        g /= d[:, None]
        g /= d[None, :]
    return g, shift, d


@dataclasses.dataclass
class _Factors:
    """The grown matrix's factors from its co-moments, and the maps that write its scores."""

    s: np.ndarray
    V: np.ndarray
    residuals: np.ndarray  # per triplet ||B^T u - s v||, rounding of the Gram included
    u_errors: np.ndarray  # per triplet, the rotated old rows' error ||E0 w_i|| / s_i
    old_map: tuple  # (T, c): old rows' scores U0 T + 1 c^T
    new_map: tuple  # (W, b): a row p's scores p W + b
    scale: np.ndarray  # D: the column scales (ones when not scaled)
    zero: np.ndarray  # per triplet, whether its value is zero within the updated Gram's rounding


def _factors(old: _Stored, m0: int, m1: int, mean: np.ndarray, c: np.ndarray) -> _Factors | None:
    """Steps 2 and 3 of the module notes: the top eigenpairs of the updated Gram, their residuals,
    and what rotating the stored scores would cost in accuracy; None where the Gram leaves float64's range."""
    upd = old.params
    k, center, scale = int(upd["k"]), bool(upd["center"]), bool(upd["scale"])
    with np.errstate(over="ignore", invalid="ignore"):  # a Gram beyond the range: None, just below
        gb, shift, d = _factored_gram(c, m1, mean, center, scale)
        gb0, shift0, d0 = _factored_gram(old.C, m0, old.mean, center, scale)
    if not (np.isfinite(gb).all() and np.isfinite(gb0).all()):
        return None
    n = gb.shape[0]
    lam, V = scipy.linalg.eigh(gb, subset_by_index=(n - k, n - 1))
    lam, V = lam[::-1], np.ascontiguousarray(V[:, ::-1])
    sig = np.sqrt(np.maximum(lam, 0.0))
    V = V * (component_signs(V) if upd.get("signs") else _aligned(V, old.V))
    rounding = m1 * np.finfo(np.float64).eps * float(np.trace(gb).real)  # ||dG||_F <= gamma_m ||B||_F^2
    safe = np.where(sig > 0, sig, 1.0)
    inv = np.where(sig > 0, 1.0 / safe, 0.0)
    resid = np.where(sig > 0, (np.linalg.norm(gb @ V - V * lam, axis=0) + rounding) / safe, 0.0)
    w = V * (d0 / d)[:, None]
    proj = w - old.V @ (old.V.conj().T @ w)  # (I - P0) w: what U0 cannot express
    u_err = np.sqrt(np.maximum(np.einsum("ij,ij->j", proj.conj(), gb0 @ proj).real, 0.0)) * inv
    return _Factors(s=sig, V=V, residuals=resid, u_errors=u_err,
                    old_map=((old.S[:, None] * (old.V.conj().T @ w)) * inv[None, :],
                             (((shift0 - shift) / d) @ V) * inv),
                    new_map=((V / d[:, None]) * inv[None, :], -((shift / d) @ V) * inv), scale=d,
                    zero=lam <= rounding)


def update_svd(job: Job, out: Location, prov: dict, growth: list[Growth], *, resume: bool) -> Any:
    """The updated factors written over ``out`` (an :class:`SVDResult`), or :class:`Recompute`."""
    (g,) = growth
    old = _open(out, prov.get("params") or {})
    upd = old.params
    m0, p = int(upd["count"]), g.rows - g.old_rows
    if m0 != g.old_rows:
        raise ParameterError(explain("out", "must keep the co-moments of the rows it covers", f"{m0} rows kept, "
                                     f"{g.old_rows} covered", "recompute it with updatable=True and --overwrite"))
    sparse = is_sparse(as_location(g.url, job.cfg.storage_options, name="input"))
    if sparse:  # a stored sparse matrix: the new rows' co-moments from dense strips of them
        A = SparseMatrix(g.url, storage_options=job.cfg.storage_options)
        # its open's stamp, before the rows are read: the output is claimed after them, and a rewrite during
        # the read had passed as the version read
        job.stamp_input(A.location, A.stamp, own_open=True)
        mom, cp = sparse_comoments(A, g.old_rows, g.rows, job.cfg.memory)
    else:
        A = row_range(job.operand(g.url, "a"), 0, g.rows)
        mom, cp = moments_and_gram(job, row_range(A, g.old_rows, g.rows), memory=job.cfg.memory)
    tol = float(upd["tol"]) if upd.get("tol") is not None else default_tol(A.dtype)
    if not np.isfinite(cp).all():
        return Recompute("the new rows' squares leave float64's range")
    # rows far from the old means overflow the rank-one term to Inf: used, and read below as a recompute
    with np.errstate(over="ignore", invalid="ignore"):
        m1, mean, c = merge_comoments(m0, old.mean, old.C.copy(), p, mom.mean, cp)
    if upd["scale"]:  # as the svd refuses it: a column whose variance left the range is no constant column
        kept = (old.mean != 0) | (np.diag(old.C).real != 0)
        nonzero = kept | mom.nonzero if mom.nonzero is not None else kept
        check_standardizable(Moments(mean, np.maximum(np.diag(c).real, 0.0) / max(m1, 1), m1, nonzero),
                             None, scale=True)
    f = _factors(old, m0, m1, mean, c)
    if f is None:  # the merged co-moments overflowed: new rows far from the old means, say
        return Recompute("the grown matrix's co-moments (or its Gram) leave float64's range")
    if f.zero.any():  # U's columns there are an orthonormal completion, orthogonal to range(A) over every row
        return Recompute(f"singular value(s) {[int(i) + 1 for i in np.flatnonzero(f.zero)][:10]} of the grown matrix are "
                         "zero within the updated Gram's rounding: their columns of U are an orthonormal completion "
                         "from the seed (as svd writes them), which needs every row of A")
    triplets = triplet_report(f.s, f.residuals, tol, A.dtype)
    bad = [i + 1 for i, ok in enumerate(triplets["converged_triplets"]) if not ok]
    if bad:
        return Recompute(f"triplet(s) {bad[:10]} of the updated Gram miss tol={tol:g}")
    rotate = old.U is not None and bool((f.u_errors <= tol).all())
    how = "the old scores rotated (Brand 2006)"
    if old.U is not None and not rotate:
        worst = int(np.argmax(f.u_errors))
        how = (f"the scores written from every row of A (one pass): rotated, the old rows' scores of triplet "
               f"{worst + 1} would be off by {f.u_errors[worst]:.2e} relative, beyond tol={tol:g}")
    if sparse and old.U is not None and not rotate:  # the scores from every row: the sparse route's recompute
        return Recompute(how.replace("the scores written from every row of A (one pass): ", ""))
    scores = out / "U"
    if old.U is not None and not out.is_local:  # an object store's output is removed when the overwriting run starts
        scores = job.scratch("scores-before", tuple(old.U.shape), old.U.dtype, tuple(old.U.chunks))
        copy_rows(job, out / "U", scores)
    if sparse:
        token = resume_token("svd-update", [], g.url, g.old_rows, g.rows, g.stamp, out.url, int(upd["k"]), tol)
        ao = job.output(out, inputs=[g.url], covered=[(g.url, g.rows)], overwrite=True, resume=resume, token=token,
                        reads_output=True)
    else:
        token = resume_token("svd-update", [row_range(A, g.old_rows, g.rows)], g.stamp, out.url, int(upd["k"]), tol)
        ao = job.claim(out, [A], overwrite=True, resume=resume, token=token, reads_output=True)
    create_group(ao.array_path())
    if old.U is not None:
        write_affine(job, ao.array_path("U"), scores, A.path, m0=m0 if rotate else 0, m1=m1, old_map=f.old_map,
                     new_map=f.new_map, dtype=old.dtype, old_chunk=int(old.U.chunks[0]), sparse=sparse)
    _write_small(ao, old, f, mean, c)
    updated = {"input": g.url, "rows_before": g.old_rows, "rows": g.rows,
               "rows_read": p if rotate or old.U is None else g.rows,
               "how": f"updated: the new rows' co-moments merged, the updated Gram's top eigenpairs; {how}",
               "scores": None if old.U is None else ("rotated" if rotate else "from every row")}
    report = job.report(method="update", passes=1 if sparse else job.passes("a"), **triplets, converged=True, tol=tol,
                        u_errors=f.u_errors.tolist(), updated=updated, sigma_max=float(f.s[0]) if f.s.size else 0.0,
                        center=bool(upd["center"]), scale=bool(upd["scale"]))
    path = ao.commit("svd", plan=prov.get("plan"), params={**(prov.get("params") or {}), "update": {**upd, "count": m1}},
                     report=job.brief(report, GROUP_REPORT_KEYS + ("u_errors", "updated")),
                     extra={"updates": list(prov.get("updates") or []) + [updated]})
    return SVDResult(Matrix(path / "U", report=report) if old.U is not None else None,
                     f.s.astype(np.finfo(old.dtype).dtype), f.V.conj().T.astype(old.dtype), report, mean=mean if upd["center"] else None,
                     scale=f.scale if upd["scale"] else None, output=path)


def _write_small(ao: Any, old: _Stored, f: _Factors, mean: np.ndarray, c: np.ndarray) -> None:
    """The group's small arrays: ``S``, ``Vt``, the means and scales factored with, the co-moments kept."""
    small = {"S": f.s.astype(np.finfo(old.dtype).dtype), "Vt": f.V.conj().T.astype(old.dtype).copy(),
             COMOMENTS: c, MEAN: mean}
    if old.params["center"]:
        small["mean"] = mean
    if old.params["scale"]:
        small["scale"] = f.scale
    for name, x in small.items():
        write_array(ao.array_path(name), np.ascontiguousarray(x))


def load(out: Location, report: dict) -> SVDResult:
    """A stored factorization as :func:`blocklin.svd` returns it (``U`` stored, ``s`` and ``Vt`` in memory)."""
    arrays = {}
    for name in ("S", "Vt", "mean", "scale"):
        try:
            arrays[name] = np.asarray(open_zarr(out / name))
        except (FileNotFoundError, OSError):
            arrays[name] = None
    try:
        U = Matrix(out / "U", report=report)
    except (FileNotFoundError, OSError):
        U = None
    return SVDResult(U, arrays["S"], arrays["Vt"], report, mean=arrays["mean"], scale=arrays["scale"], output=out)


def _aligned(V: np.ndarray, V0: np.ndarray) -> np.ndarray:
    """Signs that keep each updated right singular vector on the side of the old one it is closest to (of
    complex data, the phases that make ``v0^H v`` real and positive)."""
    k = min(V.shape[1], V0.shape[1])
    dots = np.ones(V.shape[1], dtype=V.dtype)
    dots[:k] = np.einsum("ij,ij->j", V0[:, :k].conj(), V[:, :k])
    s = np.sign(dots)
    s = s.conj() if s.dtype.kind == "c" else s
    return np.where(s == 0, 1.0, s)


__all__ = ["Recompute", "load", "update_svd"]
