"""``(A - 1 a_t^T)(A - 1 a_t^T)^H`` of a wide ``A`` (``m x m``, in memory): the rows less a chosen row ``t``.

The wide route's Gram pass with an intercept sums the rows less row 0 (the column means never formed); its
rounding is relative to ``||a_i - a_0||``, which is ``||a_0||`` for every row where row 0 lies far from the others
(a row ``1e5`` first among rows near 1). The intercept's leave-one-out (the bordered system,
:mod:`~blocklin.linalg.solve.bordered_kernel`) does not depend on which row is subtracted, so where
:func:`~blocklin.linalg.solve.bordered_kernel.shift_loss` finds row 0 far off, one more pass sums the rows less a
typical row instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.device.syrk import syrk_acc
from blocklin.plan.gram import gram_pass_memory
from blocklin.plan.passes import PassMemory
from blocklin.runtime.passes import row_kernel, run_pass, source


def _memory(params: Any, sources: tuple) -> PassMemory:
    """The Gram pass's memory (:func:`blocklin.plan.gram.gram_pass_memory`), its strips always cast (shifted)."""
    return gram_pass_memory(sources[0].width, np.dtype(params["dtype"]), cast=True, gpu=False)


@row_kernel(memory=_memory, device="cpu")
def gram_less_row_kernel(device: Any, arrays: tuple, rows: slice, params: Any, state: dict | None) -> tuple:
    """Accumulate ``S_t^T S_t`` (lower triangle) of the column strips ``S`` of ``A`` less their column ``t``
    (``params["row"]``, row ``t`` of ``A``), in a cast copy (never the strip)."""
    dt = np.dtype(params["dtype"])
    t = int(params["row"])
    first = np.asarray(arrays[0][:, t], dtype=dt)
    with np.errstate(over="ignore", invalid="ignore"):  # the scaled pass of the route bounds the sums
        a = np.subtract(arrays[0], first[:, None], dtype=dt)
    if state is None:
        state = {"g": np.zeros((a.shape[1], a.shape[1]), dt)}
    syrk_acc(state["g"], a)
    return state, None


def gram_less_row(ctx: Any, t: int) -> np.ndarray:
    """``A_t A_t^H`` of ``A_t = 2^-ea (A - 1 a_t^T)`` (the route's scaled problem; ``A A^H``'s convention, as the
    wide route holds it): one pass over column strips of ``A``, recorded for a resumed run."""
    from blocklin.linalg.products.gram_kernels import sum_gram_states

    src = source(ctx.A, transposed=True)
    params = {"dtype": ctx.cdtype, "row": int(t)}

    def run(sc: dict) -> dict:
        states = run_pass(ctx.job, gram_less_row_kernel, [src], params, scale=sc, min_tasks=1, workers=1,
                          description=f"Gram matrix A A^T of the columns less their entry {t} (leave-one-out "
                                      "with an intercept, rows far apart)").states
        g = sum_gram_states([st for st in states if st is not None])
        return {"g": g.conj() if np.iscomplexobj(g) else g}  # the pass's X^H X of X = A^T is conj(A A^H)

    return ctx.saved.run(f"wide-gram-less-row-{int(t)}", lambda: ctx.sa.run(ctx.job, run))["g"]


__all__ = ["gram_less_row", "gram_less_row_kernel"]
