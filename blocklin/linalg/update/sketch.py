"""A single-pass sketch (``svd(a, k, method="sketch", updatable=True)``) brought up to date from the
appended rows alone.

The sketch of Tropp, Yurtsever, Udell and Cevher (2019) is linear in the rows of ``B = A``. With the
test matrices ``Omega`` and ``Psi`` (``n``-sized, generated from the seed) and ``Upsilon``, ``Phi``
(one row per row of ``A``, generated from the seed *at the row's stored index*,
:func:`blocklin.linalg.blocks.random.row_test_rows`), its state is

* ``X^T = B^T Upsilon^T = sum_i b_i^T upsilon_i`` (``n x kp``),
* ``Phi^T [Y T] = sum_i phi_i^T [b_i Omega, b_i Psi]`` (``s x (kp + s)``; ``T = B Psi``),
* ``G = Y^T Y = sum_i (b_i Omega)^T (b_i Omega)`` (``kp x kp``),
* ``Y = B Omega``, one row per row of ``A`` (``m x kp``, stored),

sums over rows, every term of which depends on its own row alone. Rows ``m0:m1`` appended later add
their terms: the update makes one sketch pass over those rows
(:func:`blocklin.linalg.blocks.tall_kernels.sketch_kernel` with ``row0 = m0``, so their ``Upsilon``
and ``Phi`` rows are those a sketch of the grown matrix draws for them), adds its sums to the kept
float64 ones and appends the new rows of ``Y``. The updated state is the state of the sketch of the
grown matrix with the same seed, **up to the order of its sums**: the kept sums grouped the old rows
as their run's tasks did, the recompute groups all rows its own way, so the two differ by rounding,
within ``gamma_m |B|^T |Upsilon^T|`` (and the like for the other sums; ``gamma_m = m u / (1 - m u)``,
``u`` the unit roundoff of the data's dtype, in which each task accumulates). Then the sketch's
finishing step (:func:`blocklin.linalg.lowrank.methods.sketch_finish`, the very function the
one-pass sketch ends with) runs on the updated state: it reads ``Y`` (``m x kp``) and never ``A``.
The factors are therefore those a recompute of the sketch on the grown matrix would give, up to that
rounding carried through the finishing step (a fixed function of the state: its perturbation is that
of the state times the condition of the small problems it solves, ``R`` of ``Y``, ``Phi Q`` and
``Psi^T P``), and their accuracy against the grown matrix's SVD is the sketch's own (Tropp et al.
2019, Thm. 5.1 and Sec. 7).

Refused at creation: wide ``A`` (appended rows grow its short side), and ``center``/``scale`` (the
means move with every appended row and enter every row's sketch). A state whose sums leave the
range of float64 with the new rows is recomputed.

The test matrices' generator is the one the sketch was made with (``generator`` in its kept
parameters; none recorded: generator 1, :data:`blocklin.linalg.blocks.random.GENERATOR_PHILOX64`,
which made every sketch before the version was recorded): the appended rows' ``Upsilon`` and ``Phi``
and the finishing step's ``Psi`` must be those of the kept sums, so an update never changes generator.
A sketch made by a generator this version does not know is recomputed, with the reason in the report.

References
----------
J. A. Tropp, A. Yurtsever, M. Udell, V. Cevher, "Streaming low-rank matrix approximation with an
application to scientific simulation", SIAM J. Sci. Comput. 41(4), 2019.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from blocklin.errors import ParameterError, explain
from blocklin.linalg.blocks import random as rnd
from blocklin.linalg.blocks.results import GROUP_REPORT_KEYS
from blocklin.linalg.blocks.scaling import Scaling, unscale
from blocklin.linalg.blocks.tallblock import TallBlock
from blocklin.linalg.lowrank.methods import sketch_finish
from blocklin.linalg.lowrank.sources import Streamed
from blocklin.linalg.lowrank.svd import SVDResult
from blocklin.linalg.lowrank.triplets import triplet_report
from blocklin.linalg.lowrank.updatable import SKETCH_CORE, SKETCH_GRAM, SKETCH_XT, SKETCH_Y, sketch_state
from blocklin.linalg.update.gram import copied_before_claim
from blocklin.linalg.update.svd import Recompute
from blocklin.matrix import Matrix
from blocklin.operands import row_range
from blocklin.plan.minimum import whole_call
from blocklin.plan.svd import plan_svd
from blocklin.runtime.job import Job
from blocklin.storage import create_group, remove, write_array
from blocklin.storage.identity import resume_token
from blocklin.storage.location import Location
from blocklin.storage.versions import Growth
from blocklin.storage.zarr_store import create_array, open_zarr, read_block, write_block


@dataclasses.dataclass
class _Kept:
    """The stored sketch: its state (float64 sums in memory, ``Y`` stored) and what was factored."""

    Xt: np.ndarray
    PZ: np.ndarray
    G: np.ndarray
    Y: Any  # the stored range sketch (zarr array, m0 x kp)
    upd: dict
    has_u: bool
    dtype: np.dtype


def is_sketch(prov: dict) -> bool:
    """Whether ``prov`` is that of an updatable single-pass sketch (this module's result)."""
    upd = (prov.get("params") or {}).get("update")
    return isinstance(upd, dict) and upd.get("method") == "sketch"


def _open(out: Location, upd: dict) -> _Kept:
    try:
        arrays = {name: _wide(np.asarray(open_zarr(out / name))) for name in (SKETCH_XT, SKETCH_CORE, SKETCH_GRAM)}
        y = open_zarr(out / SKETCH_Y)
    except (FileNotFoundError, OSError):
        raise ParameterError(explain("out", "must keep the single-pass sketch's state (updatable=True)",
                                     f"{out.url}, without {SKETCH_XT}/{SKETCH_CORE}/{SKETCH_GRAM}/{SKETCH_Y}",
                                     "recompute it with updatable=True (--updatable) and --overwrite")) from None
    try:
        open_zarr(out / "U")
        has_u = True
    except (FileNotFoundError, OSError):
        has_u = False  # return_singular_vectors="vh": no long factor to write
    return _Kept(arrays[SKETCH_XT], arrays[SKETCH_CORE], arrays[SKETCH_GRAM], y, upd, has_u,
                 np.dtype(open_zarr(out / "Vt").dtype))


def _wide(x: np.ndarray) -> np.ndarray:
    """A kept sum in float64, or complex128 of complex data."""
    return x.astype(np.complex128 if x.dtype.kind == "c" else np.float64, copy=False)


def update_sketch(job: Job, out: Location, prov: dict, growth: list[Growth], *, resume: bool) -> Any:
    """The sketch of the grown matrix written over ``out`` (an :class:`SVDResult`), or :class:`Recompute`."""
    (g,) = growth
    params = prov.get("params") or {}
    old = _open(out, params["update"])
    upd = old.upd
    m0, m1, p = int(upd["count"]), g.rows, g.rows - g.old_rows
    kp, s = (int(x) for x in upd["sketch_size"])
    if m0 != g.old_rows or old.Y.shape != (m0, kp):
        raise ParameterError(explain("out", "must keep the sketch of the rows it covers", f"{m0} rows kept, Y of "
                                     f"{old.Y.shape[0]} rows, {g.old_rows} covered",
                                     "recompute it with updatable=True and --overwrite"))
    gen = upd.get("generator", rnd.GENERATOR_PHILOX64)  # kept before the version was recorded: generator 1
    if gen not in rnd.GENERATORS or isinstance(gen, bool):
        return Recompute(f"the sketch was made by test-matrix generator {gen!r}, which this version does not have "
                         f"(it has {list(rnd.GENERATORS)}); its appended rows cannot be drawn as it drew the others")
    A = row_range(job.operand(g.url, "a"), 0, g.rows)
    n, k, seed, e = A.shape[1], int(upd["k"]), int(upd["seed"]), int(upd.get("exponent", 0))
    new = row_range(A, m0, m1)
    kw = dict(method="sketch", oversample=int(upd["oversample"]), power_iters=None, memory=job.cfg.memory,
              max_passes=1, square=True)  # square: the new rows may be fewer than the columns; never transposed
    # every pass planned at one budget first: a refusal names the least budget at which all of them plan
    plan = whole_call(lambda memory: _plans(job, A, new, kw | {"memory": memory}, k, e, seed, gen, old.Y),
                      job.cfg.memory, "the sketch's update (the appended rows' sketch pass, the passes over Y)")
    if plan.sketch_size != (kp, s):
        raise ParameterError(explain("out", f"must keep a sketch of sizes {list(plan.sketch_size)} (k={k}, "
                                     f"oversample={upd['oversample']}, n={n})", f"sizes {[kp, s]}",
                                     "recompute it with updatable=True and --overwrite"))
    # the new rows' sketch, divided by the same power of two as the kept state (exact: 2^-e A's sums)
    src = Streamed(job, new, dataclasses.replace(plan, in_core=False), None,
                   Scaling(str(new.path), A.dtype, e=e))
    dXt, dPZ, dG, dY = src.sketch(kp, s, seed, generator=gen)
    Xt, PZ, G = old.Xt + dXt, old.PZ + dPZ, old.G + dG
    if not all(np.isfinite(x).all() for x in (Xt, PZ, G)):
        return Recompute("the new rows' sketch leaves float64's range at the kept state's scale")
    y_old = copied_before_claim(job, out / SKETCH_Y, old.Y)  # an object store's output goes when the claim starts
    token = resume_token("svd-sketch-update", [new], g.stamp, out.url, k, seed, [kp, s], e, gen)
    ao = job.claim(out, [A], overwrite=True, resume=resume, token=token, reads_output=True)
    if ao.resumed:  # nothing of an interrupted update is kept but its claim: every array is written again
        for name in ("U", "S", "Vt", SKETCH_XT, SKETCH_CORE, SKETCH_GRAM, SKETCH_Y):
            remove(ao.array_path(name))
    create_group(ao.array_path())
    grown = plan_svd(m1, n, k, A.dtype, **kw)
    Y = _appended(job, ao.array_path(SKETCH_Y), open_zarr(y_old), dY, m0, m1, grown.pass_memory)
    f = sketch_finish([Xt, PZ, G, Y], k=k, seed=seed, dest=ao.array_path("U") if old.has_u else None,
                      transposed_out=False, signs=bool(upd.get("signs")), generator=gen)
    sig = unscale(f.s, e) if e else f.s
    updated = {"input": g.url, "rows_before": m0, "rows": m1, "rows_read": p,
               "how": "updated: the new rows' sketch (the same seed and generator, their own rows of Upsilon and Phi) "
                      "added to the kept sums, their rows of Y appended, the sketch finished again from its state",
               "generator": gen}
    if gen != rnd.SKETCH_GENERATOR:
        updated["generator_note"] = (f"the sketch was made by test-matrix generator {gen}, so its appended rows "
                                     f"were drawn by it too (new sketches use generator {rnd.SKETCH_GENERATOR}; "
                                     "recompute with overwrite=True to move to it)")
    report = job.report(method="sketch", passes=job.passes("a"), passes_formula="1 (the appended rows)",
                        intermediate_passes=job.passes("intermediate"), **triplet_report(sig, None, None, old.dtype),
                        converged=None, tol=upd.get("tol"), seed=seed, oversample=int(upd["oversample"]),
                        sketch_size=[kp, s], sketch_generator=gen, orth=f.orth, in_core=False, updated=updated,
                        sigma_max=float(sig[0]) if sig.size else 0.0, center=False, scale=False,
                        residual_note="not computed: the single-pass sketch never reads A again; use "
                                      "method='rsvd' or 'lanczos' for residuals",
                        scaling={"exponent": e} if e else None)
    small = {"S": sig.astype(np.finfo(old.dtype).dtype), "Vt": f.V.conj().T.astype(old.dtype).copy(),  # V^H
             **sketch_state(Xt, PZ, G)}
    for name, x in small.items():
        write_array(ao.array_path(name), np.ascontiguousarray(x))
    path = ao.commit("svd", plan=prov.get("plan"), params={**params, "update": {**upd, "count": m1, "generator": gen}},
                     report=job.brief(report, GROUP_REPORT_KEYS + ("updated",)),
                     extra={"updates": list(prov.get("updates") or []) + [updated]})
    report["output"] = str(path)
    return SVDResult(Matrix(path / "U", report=report) if old.has_u else None, small["S"], small["Vt"], report,
                     output=path)


def _plans(job: Job, A: Any, new: Any, kw: dict, k: int, e: int, seed: int, gen: int, y_old: Any) -> Any:
    """Plan (nothing read or written) the update's passes at ``kw["memory"]``: the appended rows' sketch pass,
    and over the grown ``Y`` (the kept ``Y``'s chunk height) the passes :func:`sketch_finish` makes (CholeskyQR,
    the TSQR fallback, the pass writing ``U``). Returns the appended rows' plan. Planned one at a time, the
    first step's minimum was named and the passes over ``Y`` refused it again (up to 1.7x short)."""
    p, n = new.shape
    plan = plan_svd(p, n, k, A.dtype, **kw)
    src = Streamed(job, new, dataclasses.replace(plan, in_core=False), None, Scaling(str(new.path), A.dtype, e=e))
    src.plan_sketch_pass(seed, gen)
    if plan.sketch_size is not None and plan.sketch_size[0] == int(y_old.shape[1]):  # else refused by the caller
        grown = plan_svd(A.shape[0], n, k, A.dtype, **kw)
        Streamed(job, A, dataclasses.replace(grown, in_core=False), None).plan_over_y(
            int(y_old.shape[1]), max(1, int(y_old.chunks[0])), k)
    return plan


def _appended(job: Job, dest: Any, y_old: Any, y_new: TallBlock, m0: int, m1: int, memory: int) -> TallBlock:
    """The grown ``Y``: the kept rows ``0:m0`` then the new rows' (a scratch store of ``m1 - m0`` rows),
    written band by band of whole chunks by this one writer (the kept ``Y``'s chunk height)."""
    kp = int(y_old.shape[1])
    ch = max(1, int(y_old.chunks[0]))
    dt = np.dtype(y_old.dtype)
    band = ch * max(1, memory // 8 // max(1, ch * kp * dt.itemsize))  # a band read, and its copy written
    arr = create_array(dest, shape=(m1, kp), dtype=dt, chunks=(ch, kp), codec="none")
    new = open_zarr(y_new.path)
    cols = slice(0, kp)
    for r0 in range(0, m1, band):
        r1 = min(m1, r0 + band)
        block = np.empty((r1 - r0, kp), dtype=dt)
        if r0 < m0:
            block[: min(r1, m0) - r0] = read_block(y_old, slice(r0, min(r1, m0)), cols)
        if r1 > m0:
            lo = max(r0, m0)
            block[lo - r0:] = read_block(new, slice(lo - m0, r1 - m0), cols)
        write_block(arr, slice(r0, r1), cols, block)
    job.stats["bytes_written"] += m1 * kp * dt.itemsize
    return TallBlock(job, dest, m1, kp, dt, ch, memory)


__all__ = ["is_sketch", "update_sketch"]
