"""Row-pass kernels of the normal equations: the Gram pass and the refinement (residual) pass.

Each kernel is ``kernel(device, arrays, rows, params, state) -> (state, writes)`` (see
:mod:`blocklin.runtime.passes`): ``arrays`` are the strip's blocks of ``A`` and ``B``, the state
is a small dict of host arrays that the caller reduces in row order. On the CPU they use NumPy and
BLAS (the Gram update is a BLAS ``syrk``, half the flops of a GEMM); on a GPU the states stay on the
device (cuBLAS SYRK/GEMM through the device's operations, on its compute stream) and come to the
host at the end of each task's group of strips (``params["ends"]``). The caller chooses the device
(:func:`blocklin.device.pass_device`). The streaming QR pass is :mod:`blocklin.linalg.blocks.tsqr`.

A third source ``w`` (``m x 1``, ``sample_weight``) weights the rows: the Gram and residual kernels then
sum over ``sqrt(w_i)``-scaled rows on the CPU (the weighted solve runs its passes there).
:func:`weight_check_kernel` reads the weights alone; :func:`loo_kernel` gives the leave-one-out errors
of every lambda of a grid (Golub, Heath and Wahba 1979; scikit-learn's ``_RidgeGCV``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.device.syrk import syrk_acc
from blocklin.errors import InternalError
from blocklin.linalg.blocks.result_range import scaled_columns
from blocklin.linalg.blocks.tsqr import MAX_STRIP_BYTES, MIN_STRIP_ROWS, sumsq, sumsq_cols
from blocklin.plan.passes import PassMemory
from blocklin.runtime.passes import row_kernel
from blocklin.runtime.powers import ldexp


def _gram_memory(params: Any, sources: tuple) -> PassMemory:
    isz = np.dtype(params["dtype"]).itemsize
    n, k = sources[0].width, sum(s.width for s in sources[1:])
    # the Gram and A^T B accumulators; per row a cast copy of [A B] (and its sqrt(w)-scaled copy)
    # (an intercept's shift made in the cast copy)
    copies = 2 if len(sources) > 2 else 1
    return PassMemory(fixed=(n * n + n * k + 2 * (n + k)) * isz, per_row=copies * (n + k) * isz,
                      max_strip_bytes=MAX_STRIP_BYTES, min_rows=MIN_STRIP_ROWS)


def _shifted(x: Any, shift: np.ndarray, dtype: Any) -> np.ndarray:
    """``x - shift`` (per column) in ``dtype``: the cast and the shift in one new array (never ``x`` itself)."""
    return np.subtract(x, shift, dtype=dtype)


def _group_end(device: Any, rows: slice, params: Any, state: dict) -> dict:
    """On a GPU, the task's last strip brings the state to the host for the reduction (not the broadcast
    ``x`` and shifts)."""
    if rows.stop in params["ends"]:
        return {name: device.to_host(v) for name, v in state.items() if name not in ("xd", "sa0", "sb0")}
    return state


@row_kernel(memory=_gram_memory, device="any")
def gram_kernel(device: Any, arrays: tuple, rows: slice, params: Any, state: dict | None) -> tuple[dict, None]:
    """Accumulate ``A^T A`` (lower triangle; both on a GPU), ``A^T B`` and ``||B_j||^2``.

    With ``params["shift"]`` (an intercept's, :meth:`~blocklin.linalg.solve.tikhonov.TikhonovRun.shifts`) the
    sums are those of the shifted rows ``a_i - shift_a``, ``b_i - shift_b``, and their column sums ``as``,
    ``bs`` (with sample weights ``A_s^T w``, ``B_s^T w``) come from the same pass."""
    shift = params.get("shift")
    if not device.host_resident:
        if len(arrays) > 2:
            raise InternalError("gram_kernel: sample weights are summed on the CPU only (run the pass with "
                                "device='cpu')")
        dt = np.dtype(params["dtype"])
        a = device.cast(arrays[0], dt)
        b = device.cast(arrays[1], dt) if len(arrays) > 1 else None
        if state is None:
            n, k = a.shape[1], (b.shape[1] if b is not None else 0)
            state = {"g": device.zeros((n, n), dt), "c": device.zeros((n, k), dt), "bb": device.zeros((k,), np.float64)}
            if shift is not None:
                state.update({"as": device.zeros((n,), dt), "bs": device.zeros((k,), dt),
                              "sa0": device.to_device(shift[0].astype(dt, copy=False)),
                              "sb0": device.to_device(shift[1].astype(dt, copy=False))})
        if shift is not None:  # element-wise work on the compute stream, ordered with the SYRK and GEMM
            with device.on_compute():
                a, b = a - state["sa0"], b - state["sb0"]
                state["as"] += a.sum(axis=0)
                state["bs"] += b.sum(axis=0)
        device.syrk_acc(state["g"], a)
        if b is not None:
            device.gemm_acc(state["c"], a.T, b)
            device.sumsq_cols_acc(state["bb"], b)
        return _group_end(device, rows, params, state), None
    if shift is not None:  # an intercept's sums: of the rows less the first row (the cast copy holds them)
        a, b = _shifted(arrays[0], shift[0], params["dtype"]), _shifted(arrays[1], shift[1], params["dtype"])
    else:
        a = np.asarray(arrays[0], dtype=params["dtype"])
        b = np.asarray(arrays[1], dtype=params["dtype"]) if len(arrays) > 1 else None
    if state is None:
        n = a.shape[1]
        k = b.shape[1] if b is not None else 0
        state = {"g": np.zeros((n, n), params["dtype"]), "c": np.zeros((n, k), params["dtype"]),
                 "bb": np.zeros(k)}
    # the sums below overflow only where the products' sums do (see there): NumPy's warning would only alarm
    if shift is not None and len(arrays) < 3:  # the column sums of the shifted rows (weighted: A_s^T w below)
        if "as" not in state:
            state.update({"as": np.zeros(a.shape[1], a.dtype), "bs": np.zeros(b.shape[1], b.dtype)})
        with np.errstate(over="ignore", invalid="ignore"):
            state["as"] += a.sum(axis=0)
            state["bs"] += b.sum(axis=0)
    if len(arrays) > 2:  # sample weights: the sums of sqrt(w)-scaled rows, and A^T w, B^T w, sum(w)
        w = np.asarray(arrays[2], dtype=np.float64)[:, 0]
        if "aw" not in state:
            state.update(aw=np.zeros(a.shape[1], a.dtype), bw=np.zeros(b.shape[1], b.dtype), ws=0.0)
        with np.errstate(over="ignore", invalid="ignore"):
            state["aw"] += a.T @ w
            state["bw"] += b.T @ w
        state["ws"] += float(w.sum())
        sw = np.sqrt(w)[:, None]
        if shift is not None:  # the kernel's own shifted copies: scaled in place
            a *= sw
            b *= sw
        else:
            a, b = a * sw, b * sw
    syrk_acc(state["g"], a)
    if b is not None:
        # Entries beyond 2^256 overflow here only in the pass that learns max|a| and |b|, which the
        # solve repeats scaled (linalg.scaling); an overflow that stayed would reach x as Inf/NaN,
        # which the solve refuses, so NumPy's warning would only alarm.
        with np.errstate(over="ignore", invalid="ignore"):
            state["c"] += (a.conj().T if a.dtype.kind == "c" else a.T) @ b  # A^H B of complex data
        state["bb"] += sumsq_cols(b)
    return state, None  # ||A||_F^2 is the trace of the Gram matrix: no extra sweep


def _residual_memory(params: Any, sources: tuple) -> PassMemory:
    isz = np.dtype(params["dtype"]).itemsize
    n, k = sources[0].width, sum(s.width for s in sources[1:])  # (w, when given, counts as one more column)
    # the broadcast x and the A^T r accumulator; per row cast (or shifted) copies of [A B] and r, A x
    return PassMemory(fixed=2 * n * k * isz + (n + k) * isz, per_row=(n + 3 * k) * isz, max_strip_bytes=MAX_STRIP_BYTES,
                      min_rows=MIN_STRIP_ROWS)


@row_kernel(memory=_residual_memory, device="any")
def residual_kernel(device: Any, arrays: tuple, rows: slice, params: Any, state: dict | None) -> tuple[dict, None]:
    """``r = B - A X`` per strip: accumulate ``A^T r`` and ``||r_j||^2`` (refinement against the data).

    With ``params["shift"]`` (an intercept's, as the Gram pass took it) of the shifted rows:
    ``r = (B - 1 shift_b^T) - (A - 1 shift_a^T) X`` and ``A_s^T r``."""
    shift = params.get("shift")
    if not device.host_resident:
        dt = np.dtype(params["dtype"])
        a = device.cast(arrays[0], dt)
        if state is None:
            x = params["x"]
            state = {"atr": device.zeros(x.shape, dt), "rr": device.zeros((x.shape[1],), np.float64),
                     "xd": device.to_device(x.astype(dt, copy=False))}
            if shift is not None:
                state.update(sa0=device.to_device(shift[0].astype(dt, copy=False)),
                             sb0=device.to_device(shift[1].astype(dt, copy=False)))
        if shift is not None:  # on the compute stream, as the products
            with device.on_compute():
                a = a - state["sa0"]
                r = device.cast(arrays[1], dt) - state["sb0"]
        else:
            r = device.copy(device.cast(arrays[1], dt))
        device.gemm_acc(r, a, state["xd"], alpha=-1.0)
        device.gemm_acc(state["atr"], a.T, r)
        device.sumsq_cols_acc(state["rr"], r)
        return _group_end(device, rows, params, state), None
    if shift is not None:  # the shifted rows in the cast copies
        a, b = _shifted(arrays[0], shift[0], params["dtype"]), _shifted(arrays[1], shift[1], params["dtype"])
    else:
        a = np.asarray(arrays[0], dtype=params["dtype"])
        b = np.asarray(arrays[1], dtype=params["dtype"])
    x = params["x"]
    r = b - a @ x
    if state is None:
        state = {"atr": np.zeros(x.shape, params["dtype"]), "rr": np.zeros(x.shape[1])}
    wr = r * np.asarray(arrays[2], dtype=np.float64) if len(arrays) > 2 else r  # W r for sample weights
    state["atr"] += (a.conj().T if a.dtype.kind == "c" else a.T) @ wr  # A^H W r of complex data
    state["rr"] += np.einsum("ij,ij->j", wr.conj(), r).real if r.dtype.kind == "c" else \
        np.einsum("ij,ij->j", wr, r, dtype=np.float64)
    return state, None


def _weights_memory(params: Any, sources: tuple) -> PassMemory:
    return PassMemory(fixed=64, per_row=16, max_strip_bytes=MAX_STRIP_BYTES, min_rows=1)


@row_kernel(memory=_weights_memory, device="cpu")
def weight_check_kernel(device: Any, arrays: tuple, rows: slice, params: Any, state: dict | None) -> tuple[dict, None]:
    """What the checks of ``sample_weight`` need: its smallest entry (and where), non-finite and positive
    counts, the sum (float64)."""
    w = np.asarray(arrays[0], dtype=np.float64)[:, 0]
    if state is None:
        state = {"min": np.inf, "argmin": -1, "bad": 0, "first_bad": -1, "positive": 0, "sum": 0.0}
    finite = np.isfinite(w)
    if not finite.all():
        if state["first_bad"] < 0:
            state["first_bad"] = rows.start + int(np.argmin(finite))
        state["bad"] += int((~finite).sum())
        w = np.where(finite, w, 0.0)
    if w.size and float(w.min()) < state["min"]:
        state["min"], state["argmin"] = float(w.min()), rows.start + int(np.argmin(w))
    state["positive"] += int((w > 0).sum())
    state["sum"] += float(w.sum())
    return state, None


def _loo_memory(params: Any, sources: tuple) -> PassMemory:
    n, k = sources[0].width, sources[1].width
    grid = len(params["lams"])
    stored = grid * k * ((1 if params["store"] else 0) + (1 if params.get("errors") else 0))
    c = 2 if "c" in (np.dtype(sources[0].dtype).kind, np.dtype(sources[1].dtype).kind) else 1  # complex128
    # V, the coefficients of every lambda, 1/(s^2 + lam^2), the sums; per row the centered (and weighted)
    # copies of [A B], A V and its square, the hat diagonals, the fits, errors and their squares, and
    # the per-row squared errors kept for cv_results (and the signed errors a callable scorer reads); with
    # scoring=, the sums of the errors, their squares and absolute values, and of the unscaled errors per row
    sums = 3 * grid * k + 2 * k if params.get("stats") else 0
    return PassMemory(fixed=8 * c * (n * n + n * grid * k + n * grid + 2 * grid * k + n + k + sums),
                      per_row=8 * c * (3 * n + 2 * k + 2 * grid + (5 if sums else 3) * grid * k + stored + 1),
                      max_strip_bytes=MAX_STRIP_BYTES, min_rows=1)


@row_kernel(memory=_loo_memory, device="cpu")
def loo_kernel(device: Any, arrays: tuple, rows: slice, params: Any, state: dict | None) -> tuple[dict, None]:
    """Leave-one-out errors of every lambda of a grid from the spectrum ``A_c = U diag(s) V^T``.

    Rows ``a_i`` centered by ``mu`` and scaled by ``sqrt(w_i)`` as the spectrum's problem was; with
    ``p_i = V^T a_i``: the hat diagonal ``h_ii = sum_j p_ij^2 / (s_j^2 + lam^2)`` (plus ``w_i / sum w``
    for the unpenalized intercept, whose column is orthogonal to the centered ones), the residual
    ``e_i = b_i - p_i^T diag(s / (s^2 + lam^2)) beta`` and the leave-one-out error
    ``e_i / (1 - h_ii)`` (Golub, Heath and Wahba 1979; scikit-learn ``_RidgeGCV``, whose
    ``looe`` this is, weighted by ``sqrt(w_i)``). With ``params["ratio"]`` (a fit that interpolates as
    ``lam -> 0``, :func:`blocklin.linalg.solve.loo.ratio_params`) ``v`` is ``V_r diag(1 / s_r)`` over the
    resolved directions, so ``p_i = u_i``, and the error is ``(u_i^T coef) / (|u_i|^2 finv)``: the
    ``lam^2`` that ``e_i`` and ``1 - h_ii`` share cancelled, neither formed by a difference.
    Accumulates the squared errors per lambda and right-hand side (``L x k``), and keeps them per row
    when ``params["store"]``. With ``params["stats"]`` (``scoring=``) it also sums the errors of the
    original rows, ``e_i / sqrt(w_i)`` (the leave-one-out prediction's error on the unweighted target,
    as ``RidgeCV`` scores it), their squares and absolute values, and the targets' sums about
    ``params["shift"]`` (:class:`~blocklin.linalg.solve.scoring.Stats`); with ``params["errors"]`` (a
    callable scorer) it keeps those errors per row. The sums are weighted by ``w_i``
    (``RidgeCV`` hands ``sample_weight`` to its scorer). With ``params["col_e"]`` (a power of two per
    right-hand side, :func:`blocklin.linalg.solve.loo.column_powers`) column ``j``'s errors and targets
    are divided by ``2^col_e[j]`` (exact) before anything is squared, summed or kept. Complex data: the sums of errors and targets complex,
    those of their squares real (``|e_i|^2``, ``|y_i - shift|^2``).
    """
    dt = params["v"].dtype  # float64, complex128 for complex data
    a = np.asarray(arrays[0], dtype=dt)
    b = np.asarray(arrays[1], dtype=np.result_type(dt, arrays[1].dtype))
    lams, k = params["lams"], b.shape[1]
    if state is None:
        state = {"sq": np.zeros((len(lams), k)), "blocks": [], "errors": []}
    ce = params.get("col_e")  # each column by its own power of two (loo.column_powers): its squares in range
    if params.get("stats"):  # the targets' sums (weighted as the scorer weighs them: RidgeCV's score_params)
        raw = b - params["shift"] if ce is None else ldexp(b - params["shift"], -ce)
        wv = np.asarray(arrays[2], dtype=np.float64) if len(arrays) > 2 else 1.0
        if "sb" not in state:  # the sums of the targets and errors complex for complex data, their squares real
            state.update(sb=np.zeros(k, b.dtype), bb=np.zeros(k), se=np.zeros((len(lams), k), b.dtype),
                         sse=np.zeros((len(lams), k)), sae=np.zeros((len(lams), k)))
        state["sb"] += (wv * raw).sum(axis=0)
        state["bb"] += (wv * (raw * raw.conj()).real).sum(axis=0) if raw.dtype.kind == "c" else \
            (wv * raw * raw).sum(axis=0)
    if params.get("sa0") is not None:  # the Gram pass's shifted rows less their means (no |mean| rounding)
        a, b = _shifted(a, params["sa0"], a.dtype), _shifted(b, params["sb0"], b.dtype)
        a -= params["mu"]
        b -= params["bbar"]
    elif params["mu"] is not None:
        a, b = a - params["mu"], b - params["bbar"]
    w = np.asarray(arrays[2], dtype=np.float64)[:, 0] if len(arrays) > 2 else None
    zero = w == 0 if w is not None else None
    if w is not None:
        raw_a, raw_b = a[zero], b[zero]  # rows of weight 0: their error is the full fit's (below)
        sw = np.sqrt(w)[:, None]
        a, b = a * sw, b * sw
    p = a @ params["v"]
    pp = (p * p.conj()).real if p.dtype.kind == "c" else p * p
    if params.get("ratio"):  # an interpolating fit: e_i and 1 - h_ii from their lam^2 terms
        with np.errstate(divide="ignore", invalid="ignore"):
            looe = (p @ params["coef"]).reshape(len(a), len(lams), k) / (pp @ params["finv"])[:, :, None]
        if zero is not None:  # 0 / 0 there (p_i = 0); a row of weight 0 weighs 0 (its error had made every score NaN)
            looe[zero] = 0.0
    else:
        h = pp @ params["finv"]
        if params["intercept"]:
            h += (w[:, None] if w is not None else 1.0) / params["wsum"]
        fit = (p @ params["coef"]).reshape(len(a), len(lams), k)
        with np.errstate(divide="ignore", invalid="ignore"):
            looe = (b[:, None, :] - fit) / (1.0 - h)[:, :, None]
    if ce is not None:
        looe = ldexp(looe, -ce)
    sq = (looe * looe.conj()).real if looe.dtype.kind == "c" else looe * looe
    state["sq"] += sq.sum(axis=0)
    if params["store"]:
        state["blocks"].append((rows.start, sq.reshape(len(a), -1)))
    if params.get("stats"):  # w e, w e^2, w |e| of e = looe / sqrt(w): looe sqrt(w), looe^2, |looe| sqrt(w)
        s1 = sw[:, :, None] if w is not None else 1.0
        state["se"] += (looe * s1).sum(axis=0)
        state["sse"] += sq.sum(axis=0)
        state["sae"] += (np.abs(looe) * s1).sum(axis=0)
        if params.get("errors"):
            with np.errstate(divide="ignore", invalid="ignore"):
                err = looe / sw[:, :, None] if w is not None else looe
            if zero is not None and zero.any():  # left out, a row of weight 0 changes no fit: its error is the
                # full fit's residual (e / sqrt(w) had been 0 / 0, a NaN prediction handed to the scorer)
                coef = params["coef"] * params["s2"][:, None] if params.get("ratio") else params["coef"]
                full = raw_b[:, None, :] - ((raw_a @ params["v"]) @ coef).reshape(len(raw_a), len(lams), k)
                err[zero] = full if ce is None else ldexp(full, -ce)
            state["errors"].append((rows.start, err.reshape(len(a), -1)))
    return state, None


def _fold_memory(params: Any, sources: tuple) -> PassMemory:
    n, k = sources[0].width, sources[1].width
    sets = 2 if params["weighted"] else 1  # the weighted training sums beside the unweighted held-out ones
    c = 2 if "c" in (np.dtype(sources[0].dtype).kind, np.dtype(sources[1].dtype).kind) else 1  # complex128
    # per fold (and one slot for rows no fold holds out) its Gram matrix, A^T b and the sums; per row the
    # cast copies of [A B] (and the sqrt(w)-scaled one), the fold of each row
    return PassMemory(fixed=8 * c * sets * (params["folds"] + 1) * (n * n + n * k + n + 3 * k + 1),
                      per_row=8 * c * (sets + 1) * (n + k) + 16, max_strip_bytes=MAX_STRIP_BYTES,
                      min_rows=MIN_STRIP_ROWS)


@row_kernel(memory=_fold_memory, device="cpu")
def fold_kernel(device: Any, arrays: tuple, rows: slice, params: Any, state: dict | None) -> tuple[dict, None]:
    """The sums of every cross-validation fold in one pass: per fold ``f`` (rows held out together) its
    ``A_f^T A_f``, ``A_f^T b_f``, ``||b_f||^2``, column sums of ``A_f`` and ``b_f`` and row count, and with
    sample weights (third source) the same sums of the ``sqrt(w)``-scaled rows (``A_f^T W A_f``,
    ``A_f^T W b_f``, ``A_f^T w``, ``b_f^T w``, ``sum w``, ``b_f^T W b_f``) that the training fits take. A row's fold is given by
    ``params["bounds"]`` (contiguous folds, ``KFold``'s) or by the last source (a stored column of fold
    numbers; ``-1``: in no held-out set, kept in the extra slot ``folds``). Complex data sums in complex128:
    the Hermitian ``A_f^H A_f``, ``A_f^H b_f``, ``||b_f||^2 = sum |b_ij|^2`` (real), complex column sums;
    the weights stay real."""
    dt = np.result_type(arrays[0].dtype, arrays[1].dtype, np.float64)  # float64, complex128 for complex data
    if params.get("shift") is not None:  # an intercept's sums: of the rows less the first row (the Gram pass's)
        a, b = _shifted(arrays[0], params["shift"][0], dt), _shifted(arrays[1], params["shift"][1], dt)
    else:
        a = np.asarray(arrays[0], dtype=dt)
        b = np.asarray(arrays[1], dtype=dt)
    slots, weighted = params["folds"] + 1, params["weighted"]
    n, k = a.shape[1], b.shape[1]
    if state is None:
        names = ("", "w") if weighted else ("",)
        state = {}
        for p in names:
            state.update({f"g{p}": np.zeros((slots, n, n), dt), f"c{p}": np.zeros((slots, n, k), dt),
                          f"sa{p}": np.zeros((slots, n), dt), f"sb{p}": np.zeros((slots, k), dt),
                          f"cnt{p}": np.zeros(slots)})
        state["bb"] = np.zeros((slots, k))
        if weighted:
            state["bbw"] = np.zeros((slots, k))
    if params["bounds"] is not None:
        fold = np.searchsorted(np.asarray(params["bounds"]), np.arange(rows.start, rows.stop), side="right") - 1
    else:
        fold = np.asarray(arrays[-1], dtype=np.float64)[:, 0].astype(np.int64)
    fold = np.where(fold < 0, slots - 1, fold)
    w = np.asarray(arrays[2], dtype=np.float64)[:, 0] if weighted else None
    cplx = dt.kind == "c"
    # Entries beyond 2^256 overflow here only in the pass that learns max|a| and |b|, which is repeated
    # scaled (Tikhonov.scaled_run), as the Gram pass's: NumPy's warnings would only alarm.
    with np.errstate(over="ignore", invalid="ignore"):
        _fold_sums(state, a, b, w, fold, cplx, weighted)
    return state, None


def _fold_sums(state: dict, a: np.ndarray, b: np.ndarray, w: np.ndarray | None, fold: np.ndarray, cplx: bool,
               weighted: bool) -> None:
    """:func:`fold_kernel`'s sums of one strip, added per fold into ``state``."""
    for f in np.unique(fold):
        sel = fold == f
        af, bf = a[sel], b[sel]
        ah = af.conj().T if cplx else af.T  # A_f^H of complex data
        state["g"][f] += ah @ af
        state["c"][f] += ah @ bf
        state["sa"][f] += af.sum(axis=0)
        state["sb"][f] += bf.sum(axis=0)
        state["cnt"][f] += af.shape[0]
        state["bb"][f] += sumsq_cols(bf)
        if weighted:
            wf = w[sel]
            sw = np.sqrt(wf)[:, None]
            aw, bw = af * sw, bf * sw
            awh = aw.conj().T if cplx else aw.T
            state["gw"][f] += awh @ aw
            state["cw"][f] += awh @ bw
            state["saw"][f] += af.T @ wf
            state["sbw"][f] += bf.T @ wf
            state["cntw"][f] += float(wf.sum())
            state["bbw"][f] += sumsq_cols(bw)


def _shifted_product_memory(params: Any, sources: tuple) -> PassMemory:
    y = params["y"]
    isz = y.dtype.itemsize
    m, k = y.shape
    # the broadcast y (and its upload); per row the shifted copy of the strip and its scaled copy (the
    # norm's), its product and the rows written in the output's dtype, its 2^alpha copy and the two
    # magnitudes and exponents ColumnRange compares
    return PassMemory(fixed=2 * m * k * isz, per_row=(2 * m + 6 * k) * isz, chunk_temporaries=True,
                      max_strip_bytes=MAX_STRIP_BYTES, write_row_bytes=k * np.dtype(params["out"]).itemsize)


@row_kernel(memory=_shifted_product_memory, device="any", read_only=True)
def shifted_product_kernel(device: Any, arrays: tuple, rows: slice, params: Any,
                           state: dict | None) -> tuple[dict, dict]:
    """``x_i = 2^alpha (X_i - X_i[:, t] 1^T)^H y`` per strip ``X_i`` of ``A^T`` (column strips of a wide ``A``; ``t =
    params["row"]``, 0 unless given), written in ``params["out"]``'s dtype, ``||2^-e A_s||_F^2`` (state ``"aa"``,
    ``2^-e = params["unit"]``: the solve's scaling, so that the sum stays within float64's range) of
    ``A_s = A - 1 a_t^T``, and ``a_t^T (A_s^H y)`` (state ``"ax"``, per column of ``y``, in float64 before
    ``2^alpha``: the intercept's ``a_t^T x`` where the solve shifted its kernel by row ``t``,
    :func:`~blocklin.linalg.solve.shifted_gram.less_typical_row`).

    The wide solve's ``x = A^H z`` with ``1^T z = 0`` (an intercept's ``z = P_w^H y``): ``A_s^H z = A^H z``
    exactly, but its sums round relative to ``|A_s|`` (the spread of ``A``'s columns) where ``A^H z``'s round
    relative to ``|A|`` (their means), so ``1^T z``'s own rounding (``eps ||z||``) is not multiplied by the
    means. The shift is made in a copy of the strip in ``params["y"]``'s dtype (float64 or complex128), never
    in the strip."""
    dt = params["y"].dtype
    cplx = dt.kind == "c"
    t = int(params.get("row", 0))
    if not device.host_resident:
        if state is None:
            state = {"yd": device.to_device(params["y"]), "aa": device.zeros((arrays[0].shape[1],), np.float64),
                     "ax": device.zeros((params["y"].shape[1],), dt)}
        a = device.cast(arrays[0], dt)
        with device.on_compute():  # element-wise work and the product on the compute stream, in order
            first = a[:, t].copy()
            a = a - first[:, None]
        with device.on_compute():
            scaled = a * params["unit"]
        device.sumsq_cols_acc(state["aa"], scaled)
        with device.on_compute():
            x = (a.conj() if cplx else a) @ state["yd"]
            state["ax"] = state["ax"] + first @ x
        block = device.to_host(x)
        if rows.stop in params["ends"]:
            state = {"aa": float(device.to_host(state["aa"]).sum()), "ax": device.to_host(state["ax"])} | \
                ({"cols": state["cols"]} if "cols" in state else {})
    else:
        if state is None:
            state = {"aa": 0.0, "ax": 0.0}
        with np.errstate(over="ignore", invalid="ignore"):  # beyond the range: Inf, which the caller refuses
            first = np.asarray(arrays[0][:, t], dtype=dt)
            a = np.subtract(arrays[0], first[:, None], dtype=dt)
            if cplx:
                np.conjugate(a, out=a)
            state["aa"] += sumsq(a * params["unit"])
            block = a @ params["y"]
            state["ax"] = state["ax"] + first @ block
    # 2^alpha applied once to the float64 (complex128) sums, rounded once to the output; what each column kept
    # (ColumnRange) is judged by the caller: an x flushed to 0 or beyond the range is refused, a subnormal warns
    out, cols = scaled_columns(block, params["alpha"], params["out"])
    if "cols" in state:
        state["cols"].merge(cols)
    else:
        state["cols"] = cols
    return state, {"x": out}
