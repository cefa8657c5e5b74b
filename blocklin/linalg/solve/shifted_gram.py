"""``(A - 1 a_t^T)(A - 1 a_t^T)^H`` of a wide ``A`` (``m x m``, in memory): the rows less a chosen row ``t``.

The wide route's Gram pass with an intercept sums the rows less row 0 (the column means never formed); its
rounding is relative to ``||a_i - a_0||``, which is ``||a_0||`` for every row where row 0 lies far from the others
(a row ``1e5`` first among rows near 1). The intercept's problems (the leave-one-out's bordered system, the k-fold
fits, the solve at one lambda: :mod:`~blocklin.linalg.solve.bordered_kernel`) do not depend on which row is
subtracted, so where :func:`~blocklin.linalg.solve.bordered_kernel.shift_loss` finds row 0 far off, one more pass
sums the rows less a typical row instead (:func:`less_typical_row`: once per solve, whichever of them asks first),
and the product ``x = A^H z`` subtracts that row too (:func:`~blocklin.linalg.solve.kernels.shifted_product_kernel`).
"""

from __future__ import annotations

import dataclasses
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


def row_store(ctx: Any, row: int = 0) -> Any:
    """Row ``row`` of ``A`` (float64, ``1 x n``) in a scratch store chunked as ``A``'s columns, copied chunk by
    chunk: the shift of the out-of-core GEMM (:attr:`~blocklin.runtime.tiles.GemmSpec.shift`) of the route's
    Gram matrix (row 0) and of :func:`gram_less_row` (row ``t``)."""
    from blocklin.storage.zarr_store import open_cached, read_block, write_block

    n, step = ctx.n, max(1, int(ctx.A.chunks[1]))
    path = ctx.job.scratch("first row" if row == 0 else f"row {row}", (1, n), np.float64, (1, min(n, step)))
    src, dst = open_cached(ctx.A.path), open_cached(path, "r+")
    r0 = int(getattr(ctx.A, "first_row", 0)) + row
    for c0 in range(0, n, step):
        cols = slice(c0, min(n, c0 + step))
        write_block(dst, slice(0, 1), cols, np.asarray(read_block(src, slice(r0, r0 + 1), cols), dtype=np.float64))
    return path


def _gemm_less_row(ctx: Any, t: int, g0: np.ndarray) -> np.ndarray:
    """:func:`gram_less_row` by an out-of-core GEMM (real data, the SYRK pass's ``m x m`` sums over the budget):
    both operands shifted by row ``t`` as they are read, except ``A^T``'s column 0, so that column is
    ``(A - 1 a_t^T) a_1``, replaced by its row 0, and its ``(0, 0)`` by ``||a_1 - a_t||^2`` (``g0``'s ``(t, t)``, of
    the rows less row 0). Its resume token names the row (:attr:`~blocklin.linalg.products.gemm.Gemm.shift_row`),
    so it is not taken for the route's GEMM less row 0."""
    from blocklin.linalg.products.gemm import Gemm
    from blocklin.runtime.powers import ldexp
    from blocklin.storage.zarr_store import open_zarr

    job = ctx.job
    gram = dataclasses.replace(Gemm.of(ctx.A, ctx.A, trans_b=True, dtype="float64"), shift=row_store(ctx, t),
                               shift_row=int(t))
    plan = gram.plan(job, read_reserve=True)
    path = job.scratch("gram less row", gram.shape, np.float64, plan.out_chunks)
    gram.run(job, plan, path, description=f"Gram matrix A A^T of the rows less row {t} (rows far apart)",
             count_pass="a")
    k = open_zarr(path)[...]
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        k = ldexp(k, -2 * ctx.sa.exponent)  # the route's scaled problem (its GEMM fallback: exponent 0)
    k[1:, 0] = k[0, 1:]
    k[0, 0] = g0[t, t]
    return (k + k.T) / 2


def gram_less_row(ctx: Any, t: int, g0: np.ndarray) -> np.ndarray:
    """``A_t A_t^H`` of ``A_t = 2^-ea (A - 1 a_t^T)`` (the route's scaled problem; ``A A^H``'s convention, as the
    wide route holds it): one pass over column strips of ``A`` (the SYRK pass; real data whose ``m x m`` sums do
    not fit the budget: an out-of-core GEMM, :func:`_gemm_less_row`), recorded for a resumed run. ``g0``: the
    kernel of the rows less row 0 the route holds."""
    from blocklin.errors import BudgetError
    from blocklin.linalg.products.gram_kernels import sum_gram_states

    src = source(ctx.A, transposed=True)
    params = {"dtype": ctx.cdtype, "row": int(t)}

    def run(sc: dict) -> dict:
        states = run_pass(ctx.job, gram_less_row_kernel, [src], params, scale=sc, min_tasks=1, workers=1,
                          description=f"Gram matrix A A^T of the columns less their entry {t} (an intercept, "
                                      "rows far apart)").states
        g = sum_gram_states([st for st in states if st is not None])
        return {"g": g.conj() if np.iscomplexobj(g) else g}  # the pass's X^H X of X = A^T is conj(A A^H)

    def step() -> dict:
        try:
            return ctx.sa.run(ctx.job, run)
        except BudgetError:
            if ctx.cdtype != "float64":
                raise
        return {"g": _gemm_less_row(ctx, t, g0)}

    ctx.phases["gram less a row"] = ctx.job.device
    return ctx.saved.run(f"wide-gram-less-row-{int(t)}", step)["g"]


def less_typical_row(ctx: Any, g0: np.ndarray, w: np.ndarray, lam2: Any) -> tuple[int, np.ndarray]:
    """``(t, K_t)``: the row the intercept's kernel is best summed less and that kernel (unweighted, the route's
    scaled problem). ``(0, g0)`` (``g0``: the rows less row 0, as the route's Gram pass sums them) where
    :func:`~blocklin.linalg.solve.bordered_kernel.shift_loss` of ``g0`` stays within ``m`` at every ``lam2``;
    else the kernel of the rows less its typical row by one more pass (:func:`gram_less_row`). Kept on ``ctx``
    (``less_row``): the choice of lambda (leave-one-out, k-fold) and the solve at the chosen lambda share the
    one pass, and a later caller takes it whatever its own lambdas."""
    from blocklin.linalg.solve.bordered_kernel import shift_loss

    if ctx.less_row is not None:
        return ctx.less_row
    t, rho2 = shift_loss(g0, w, lam2)
    if t == 0 or float(rho2.max(initial=1.0)) <= g0.shape[0] or ctx.A is None:
        return 0, g0
    k = gram_less_row(ctx, t, g0)
    ctx.less_row = (t, k) if np.all(np.isfinite(k)) else (0, g0)  # beyond the range: the rows less row 0
    return ctx.less_row


__all__ = ["gram_less_row", "gram_less_row_kernel", "less_typical_row", "row_store"]
