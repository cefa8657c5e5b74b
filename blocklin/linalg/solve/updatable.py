"""What a tall least-squares ``solve`` keeps so that :func:`blocklin.update` can bring it up to date.

With ``updatable=True`` the output ``x`` also holds the sums the normal equations are made of:
``A^T A``, ``A^T b``, ``||b||^2`` (per column), ``||A||_F^2``, the row count and, with
``fit_intercept``, those of the rows less the first row (``sa0``, ``sb0``: the route's shift, which the update
subtracts from the appended rows too) and their column sums ``sa``, ``sb`` (``.blocklin-state.npz`` inside the output,
float64; of complex data ``A^H A``, ``A^H b`` and the means in complex128). They are sums over rows: the rows appended later add their own, and every lambda, GCV and
the L-curve follow from the updated sums by the spectral route (:mod:`blocklin.linalg.update.solve`).
A solve whose first pass is not the Gram pass (the streaming QR) makes that pass once more.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from blocklin.errors import ParameterError, explain
from blocklin.linalg.solve.normal import gram_sums
from blocklin.linalg.solve.tikhonov import TikhonovRun
from blocklin.storage.backend import backend

#: The object inside the output holding the kept sums.
STATE = ".blocklin-state.npz"
#: The arrays of the record and their meaning.
FIELDS = ("g", "c", "bb", "aa", "m", "sa0", "sb0", "sa", "sb")


def keep_sums(ctx: TikhonovRun, where: Any) -> None:
    """Write the sums of ``ctx``'s problem into ``where`` (the output's partial): those its route made,
    or one Gram pass where it made none; refused where the data was scaled by a power of two (its
    squares were outside float64's range)."""
    gp = gram_sums(ctx)
    if ctx.sb.columns is not None:  # each column divided by its own power: no one set of float64 sums holds them
        far = np.flatnonzero(np.asarray(ctx.sb.columns) < int(np.max(ctx.sb.columns)) - 511)
        raise ParameterError(explain("updatable", "keeps A^T b and ||b||^2 of every column in float64 at one scale, "
                                     "which must hold each column's squares", f"column(s) {far.tolist()} of b more "
                                     f"than 2^511 below its largest (powers of two {ctx.sb.columns.tolist()}): their "
                                     "squares are outside float64's range beside the largest column's",
                                     "solve the columns far apart in separate outputs (each updatable), or pass "
                                     "updatable=False"))
    if ctx.sa.exponent or ctx.sb.exponent:
        raise ParameterError(explain("updatable", "keeps A^T A and A^T b in float64, which must hold the data's "
                                     "squares", f"data scaled by 2^{ctx.sa.exponent} (A) and 2^{ctx.sb.exponent} (b) "
                                     "to keep them in range", "scale the data by a power of two so that its "
                                     "entries sit near 1, or pass updatable=False"))
    rec = {"g": gp["g"], "c": gp["c"], "bb": np.asarray(gp["bb"], dtype=np.float64), "aa": np.float64(gp["aa"]),
           "m": np.int64(ctx.m)}
    if ctx.intercept:  # the sums are of the rows less the first row: that shift, and the shifted rows' column sums
        rec.update(sa0=gp["sa0"], sb0=gp["sb0"], sa=gp["as"], sb=gp["bs"])
    buf = io.BytesIO()
    np.savez(buf, **rec)
    backend(where).write_bytes(STATE, buf.getvalue())


def load_sums(where: Any) -> dict | None:
    """The kept sums of a solve output, or None (computed without ``updatable=True``). A record of the means
    (``mu``, ``bbar``: sums of the rows as they are) reads as sums about a zero shift."""
    raw = backend(where).try_read(STATE)
    if raw is None:
        return None
    with np.load(io.BytesIO(raw)) as z:
        rec = {k: z[k] for k in z.files}
    if "mu" in rec and "sa0" not in rec:
        m = int(rec["m"])
        rec.update(sa0=np.zeros_like(rec["mu"]), sb0=np.zeros_like(rec["bbar"]), sa=m * rec.pop("mu"),
                   sb=m * rec.pop("bbar"))
    return rec


def check_updatable(*, out: Any, orientation: str) -> None:
    if out is None:
        raise ParameterError(explain("updatable", "needs out= (the result updated later is a stored one)",
                                     "out=None", "pass out='x.zarr'"))
    if orientation != "tall":
        raise ParameterError(explain("updatable", "needs a tall A solved by least squares (rows appended to a wide "
                                     "A grow its short side, whose Gram the dual form keeps)",
                                     f"a {orientation} problem", "recompute after each append"))


__all__ = ["FIELDS", "STATE", "check_updatable", "keep_sums", "load_sums"]
