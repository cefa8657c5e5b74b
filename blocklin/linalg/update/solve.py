"""A tall least-squares / ridge ``solve`` brought up to date after rows were appended to ``A`` and ``b``.

A solve computed with ``updatable=True`` keeps the sums of its normal equations (``A^T A``,
``A^T b``, ``||b||^2``, the row count and, with ``fit_intercept``, those of the rows less the solve's
first row and their column sums: :mod:`blocklin.linalg.solve.updatable`). The appended rows add their own
sums (one Gram pass over them, with an intercept less the same first row, their column sums from that pass),
and the solve runs again on the updated sums without reading the old rows: the same ``lam``, the
same sequence, or the same rule (GCV, L-curve) chosen again on the updated spectrum
(:mod:`blocklin.linalg.solve.spectrum`), the same rank-one centering for the intercept.

That is the normal-equations route without its refinement passes (a refinement pass reads every
row): accurate to about ``cond(A^T A + lam^2 I) eps`` relative. Where that reciprocal condition is
below the route's own limit (``normal.AUTO_RCOND``; the solve itself switches to the streaming QR
there), or the spectrum route refuses the lambdas, the result is recomputed instead (the report
says why). The sums are exact float64 sums of the rows; a recompute sums them in other groups
(within the Gram's rounding bound).

Complex data (LAPACK's conventions, as the solve's own routes): the sums are ``A^H A``, ``A^H b`` in
complex128 and ``|b|^2``, the column sums complex, the centering ``A_s^H A_s - m conj(d) d^T`` (``d`` the
shifted rows' mean).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.errors import ParameterError, explain
from blocklin.linalg.blocks.scaling import Scaling
from blocklin.device.syrk import symmetrize_lower
from blocklin.linalg.solve import lambda_select
from blocklin.linalg.solve.kernels import gram_kernel
from blocklin.linalg.solve.normal import AUTO_RCOND, AUTO_REFINE_RCOND, solve_tall
from blocklin.linalg.solve.tikhonov import factor_regularized
from blocklin.linalg.solve.report import solve_report
from blocklin.linalg.solve.router import parse_lam
from blocklin.linalg.solve.spectrum import spectrum_from_gram
from blocklin.linalg.solve.tikhonov import TikhonovRun
from blocklin.linalg.solve.updatable import keep_sums, load_sums
from blocklin.linalg.update.svd import Recompute
from blocklin.operands import row_range
from blocklin.plan.solve import small_bytes
from blocklin.runtime.job import Job
from blocklin.runtime.passes import run_pass, source
from blocklin.storage.identity import resume_token
from blocklin.storage.location import Location
from blocklin.storage.versions import Growth


class _Seeded:
    """The steps a solve's route asks for (``StepRecords``' interface), answered from the updated sums."""

    def __init__(self, records: dict) -> None:
        self.records = records
        self.loaded: list[str] = []

    def run(self, name: str, step: Any) -> Any:
        if name in self.records:
            self.loaded.append(name)
            return self.records[name]
        return step()


def _new_sums(job: Job, A: Any, B: Any, shift: tuple | None) -> dict:
    """The appended rows' sums in one Gram pass over them (with an intercept, of the rows less the kept
    shift, the solve's first rows, and their column sums from the same pass: they add to the kept ones)."""
    n, k = A.shape[1], B.shape[1]
    dtype = "complex128" if "c" in (A.dtype.kind, B.dtype.kind) else "float64"  # A^H A, A^H b of complex data
    states, _ = run_pass(job, gram_kernel, [source(A), source(B)], {"dtype": dtype} | ({"shift": shift} if shift else {}),
                         reserve=small_bytes(n, k), description="Gram pass over the appended rows: A^T A, A^T b",
                         device="cpu" if dtype != "float64" else None)  # the device kernels' products are real ones
    states = [s for s in states if s is not None]
    g = states[0]["g"]
    for s in states[1:]:
        g += s["g"]
    out = {"g": symmetrize_lower(g), "c": sum(s["c"] for s in states), "bb": sum(s["bb"] for s in states)}
    if shift:
        out["sa"] = sum(s["as"] for s in states)
        out["sb"] = sum(s["bs"] for s in states)
    return out


def update_solve(job: Job, out: Location, prov: dict, growth: list[Growth], *, resume: bool) -> Any:
    """``x`` solved again from the updated sums and written over ``out``, or :class:`Recompute`."""
    params = prov.get("params") or {}
    kept = load_sums(out)
    if kept is None:
        raise ParameterError(explain("out", "must be a solve computed with updatable=True (it keeps the sums an "
                                     "update reads)", f"{out.url}, computed without them", "recompute it with "
                                     "updatable=True (--updatable) and --overwrite"))
    if len(growth) != 2 or (growth[0].old_rows, growth[0].rows) != (growth[1].old_rows, growth[1].rows):
        raise ParameterError(explain("b", "must have grown by the rows A grew by (one appended row of b per row of "
                                     "A)", ", ".join(f"{g.url}: {g.old_rows} -> {g.rows} rows" for g in growth),
                                     "append the matching rows to both, then update"))
    ga, gb = growth
    m0, m1 = int(kept["m"]), ga.rows
    if m0 != ga.old_rows:
        raise ParameterError(explain("out", "must keep the sums of the rows it covers", f"{m0} rows kept, "
                                     f"{ga.old_rows} covered", "recompute it with updatable=True and --overwrite"))
    intercept = bool(params.get("fit_intercept"))
    kind, lams = parse_lam(params["lam"])
    A, B = row_range(job.operand(ga.url, "a"), 0, ga.rows), row_range(job.operand(gb.url, "b"), 0, gb.rows)
    shift = (kept["sa0"], kept["sb0"]) if intercept else None  # the appended rows shifted as the kept ones were
    new = _new_sums(job, row_range(A, m0, m1), row_range(B, m0, m1), shift)
    g = kept["g"] + new["g"]
    sums = {"g": g, "c": kept["c"] + new["c"], "bb": kept["bb"] + new["bb"], "aa": float(np.trace(g).real), "ea": 0,
            "eb": 0}
    if intercept:
        sums.update({"sa0": kept["sa0"], "sb0": kept["sb0"], "as": kept["sa"] + new["sa"], "bs": kept["sb"] + new["sb"]})
    if not all(np.isfinite(v).all() for v in (sums["g"], sums["c"], sums["bb"])):
        return Recompute("the appended rows' squares leave float64's range")
    records = {"gram-pass": sums}
    why = _ill_conditioned(sums, intercept, m1, kind, lams)
    if why:
        return Recompute(why)
    ctx = TikhonovRun(job=job, A=A, B=B, m=m1, n=A.shape[1], k=B.shape[1], kind=kind, lams=lams, refine=0,
                      method="normal", intercept=intercept, saved=_Seeded(records))  # type: ignore[arg-type]
    ctx.sa, ctx.sb = Scaling(str(source(A).path), A.dtype, e=0), Scaling(str(source(B).path), B.dtype, e=0)
    token = resume_token("solve-update", [row_range(A, m0, m1), row_range(B, m0, m1)], ga.stamp, gb.stamp, out.url,
                         params.get("lam"), intercept)
    ao = job.claim(out, [A, B], overwrite=True, resume=resume, token=token, reads_output=True)
    info = solve_tall(ctx, ao.array_path())
    keep_sums(ctx, ao.array_path())
    updated = {"input": ga.url, "rows_before": m0, "rows": m1, "rows_read": m1 - m0,
               "how": "updated: the appended rows' sums added, solved again from the updated normal equations "
                      "(no refinement pass: it would read every row)"}
    info["method_reason"] = f"update: {info.get('method_reason', '')}"
    report, recorded = solve_report(job, route="least squares", orientation="tall", **info, phases=ctx.phases,
                                    fit_intercept=intercept, resumed_passes=[])
    report["updated"] = recorded["updated"] = updated
    history = list(prov.get("updates") or []) + [updated]
    x = job.finish(ao, out, report, operation="solve", plan=prov.get("plan"), params=params, recorded=recorded,
                   extra={"updates": history})
    x.intercept = np.asarray(report["intercept"]) if intercept else None
    return x


def _ill_conditioned(sums: dict, intercept: bool, m: int, kind: str, lams: list[float]) -> str | None:
    """Why the updated normal equations would not give what the solve's own route gives (None: they do)."""
    g = sums["g"]
    means = {"mu": sums["as"] / m, "bbar": sums["bs"] / m} if intercept else None  # the shifted rows' means
    if means is not None:  # the centered Gram, as the route forms it (A_s^H A_s - m conj(d) d^T of complex data)
        g = g - m * np.outer(np.conjugate(means["mu"]), means["mu"])
        g = (g + g.conj().T) / 2
    if kind == "scalar":
        cf, rcond = factor_regularized(g, lams[0])
        if cf is None or rcond < AUTO_RCOND:
            return (f"A^T A + lam^2 I is ill-conditioned (reciprocal condition {rcond:.1e} < {AUTO_RCOND:.0e}): "
                    "the solve takes the streaming QR, which reads every row")
        return None
    c = sums["c"] if means is None else sums["c"] - m * np.outer(np.conjugate(means["mu"]), means["bbar"])
    bb = sums["bb"] if means is None else sums["bb"] - m * np.abs(means["bbar"]) ** 2
    spec = spectrum_from_gram(g, c, bb, m, dual=False, n=g.shape[0])
    rule = kind if kind in ("gcv", "lcurve") else None
    chosen = [lambda_select.choose_lambda(spec, rule, quiet=True)[0]] if rule else lams
    ok, _, reason = lambda_select.spectrum_route(spec.s, chosen, rule, rcond_rule=AUTO_RCOND,
                                                 rcond_sequence=AUTO_REFINE_RCOND)
    return None if ok else f"the updated spectrum does not allow the normal equations ({reason})"


__all__ = ["update_solve"]
