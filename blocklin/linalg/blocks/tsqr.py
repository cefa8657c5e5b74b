"""Streaming TSQR: the R factor of a tall matrix in one pass, without forming ``Q``.

Row strips of ``[A B]`` fold into a running triangular factor, ``R <- qr_r([R; strip])`` (a flat
TSQR tree per task); the tasks' factors are reduced in row order by one more QR, so the result does
not depend on the scheduler. This is the communication-avoiding TSQR of Demmel, Grigori, Hoemmen
and Langou (SIAM J. Sci. Comput. 34(1), 2012). Householder QR is unconditionally stable, which
makes it the fallback of the CholeskyQR family (:mod:`blocklin.linalg.blocks.orth`) and the accurate route
of the regularized solver (:mod:`blocklin.linalg.solve.qr_route`).

The one sign convention of the package lives here too: :func:`diagonal_signs` makes an R factor's
diagonal non-negative (``Q`` and ``R`` are unique up to those signs), and real for complex data
(``Q`` and ``R`` are unique up to a unit-modulus factor per column; LAPACK's ``zgeqrf`` leaves a
complex diagonal).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.plan.passes import PassMemory
from blocklin.runtime.passes import row_kernel

#: Largest strip a QR pass reads at once (bigger strips do not make LAPACK faster, only memory larger).
MAX_STRIP_BYTES = 96 * 2**20
#: Rows a strip must hold for re-factoring ``[R; strip]`` to be amortized.
MIN_STRIP_ROWS = 64


def r_factor(x: np.ndarray) -> np.ndarray:
    """Upper-triangular (trapezoidal when short) R of Householder QR, at most ``width`` rows (SciPy's
    ``qr(mode="r")`` bits, without the GIL: :func:`blocklin.device.host_blas.qr_r`, so a pass's tasks
    factor at once)."""
    from blocklin.device.host_blas import qr_r

    if x.shape[0] == 0:
        return x
    return np.ascontiguousarray(qr_r(x))


def diagonal_signs(r: np.ndarray) -> np.ndarray:
    """``d`` with ``d[i] = sign(r[i, i])`` (``+1`` for a zero): ``diag(d) R`` has a non-negative diagonal.

    Complex ``r``: ``d[i] = conj(r_ii) / |r_ii|``, so ``diag(d) R`` has a real non-negative diagonal
    (``Q diag(d)^H`` the matching ``Q``: :func:`signed_columns`)."""
    d = np.sign(np.diag(r))
    d[d == 0] = 1
    return d.conj() if d.dtype.kind == "c" else d


def signed_columns(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    """``Q diag(d)^H``: the ``Q`` of ``diag(d) R`` (``d`` from :func:`diagonal_signs`, unit modulus)."""
    return q * (d.conj() if d.dtype.kind == "c" else d)


def positive_diagonal(r: np.ndarray) -> np.ndarray:
    """``diag(d) R`` with the signs of :func:`diagonal_signs` (the unique R with a non-negative diagonal;
    of complex data, a real one: its moduli, exactly, rather than ``conj(r_ii) r_ii / |r_ii|`` rounded)."""
    out = diagonal_signs(r)[:, None] * r
    if out.dtype.kind == "c":
        k = min(out.shape)
        out[np.arange(k), np.arange(k)] = np.abs(np.diag(r)[:k])
    return out


def sumsq(a: np.ndarray) -> float:
    """``||a||_F^2`` accumulated in float64 (of complex data, the moduli squared)."""
    if a.dtype.kind == "c":
        return sumsq(a.real) + sumsq(a.imag)
    return float(np.einsum("ij,ij->", a, a, dtype=np.float64))


def sumsq_cols(a: np.ndarray) -> np.ndarray:
    """Each column's ``sum |a_ij|^2``, float64."""
    if a.dtype.kind == "c":
        return sumsq_cols(a.real) + sumsq_cols(a.imag)
    return np.einsum("ij,ij->j", a, a, dtype=np.float64)


def _tsqr_memory(params: Any, sources: tuple) -> PassMemory:
    isz = np.dtype(params["dtype"]).itemsize
    # the ones column of an intercept, or the first entries beside the shifted columns
    w = sum(s.width for s in sources) + bool(params.get("ones")) + bool(params.get("shift_first"))
    # the running (w x w) factor, the stacked [R; strip] handed to LAPACK and its output; per row the
    # [A B] copy, the stacked copy and LAPACK's column-major copy; zarr's chunk temporaries (a strip
    # shorter than a chunk still decodes whole chunks)
    return PassMemory(fixed=3 * w * w * isz, per_row=3 * w * isz, chunk_temporaries=True,
                      max_strip_bytes=MAX_STRIP_BYTES, strip_floor=4 * w, min_rows=MIN_STRIP_ROWS, write_row_bytes=0)


def _tsqr_on_device(device: Any, arrays: tuple, rows: slice, params: Any, state: dict | None) -> dict:
    """The GPU branch: the running factor stays on the device (cuSOLVER QR of ``[R; strip]``)."""
    dt = np.dtype(params["dtype"])
    parts = [device.cast(x, dt) for x in arrays]
    n = parts[0].shape[1]
    # [1 | A | B] of an intercept: the ones column (never scaled) made on the device
    lead = [device.to_device(np.ones((parts[0].shape[0], 1), dt))] if params.get("ones") else []
    strip = device.concat(lead + parts, axis=1) if len(lead + parts) > 1 else parts[0]
    width = strip.shape[1]
    if params.get("shift") is not None:  # the rows less the first row, as the host branch
        j = len(lead)
        shift = [device.to_device(np.asarray(v, dt)) for v in params["shift"]]
        with device.on_compute():  # CuPy's elementwise ops on the stream that made the strip and reads it
            _shift(strip, j, n, shift)
        parts = [strip[:, j:j + n], strip[:, j + n:]]
    if params.get("shift_first"):  # [S - S[:, :1] 1^T | S[:, :1]], as the host branch
        with device.on_compute():
            first = strip[:, :1].copy()
            shifted = strip - first
        strip, parts = device.concat([shifted, first], axis=1), [shifted]
    if state is None:
        state = {"r": None, "aa": device.zeros((n,), np.float64),
                 "bb": device.zeros((width - n - len(lead),), np.float64)}
    device.sumsq_cols_acc(state["aa"], parts[0])
    if len(parts) > 1:
        device.sumsq_cols_acc(state["bb"], parts[1])
    state["r"] = device.qr_r(strip if state["r"] is None else device.concat([state["r"], strip], axis=0))
    if rows.stop in params["ends"]:  # the task's last strip: the state to the host for the reduction
        return {"r": device.to_host(state["r"]), "aa": float(device.to_host(state["aa"]).sum()),
                "bb": device.to_host(state["bb"])}
    return state


@row_kernel(memory=_tsqr_memory, device="any")
def tsqr_kernel(device: Any, arrays: tuple, rows: slice, params: Any, state: dict | None) -> tuple[dict, None]:
    """``R <- R-factor of [R; A_i B_i]`` in ``params["dtype"]``; also ``||A||_F^2`` and ``||B_j||^2``.

    ``params["ones"]``: a column of ones first, ``[1 | A_i | B_i]`` (an intercept: the first Householder
    step then removes the column means, so the trailing factor is that of the centered ``[A B]``).
    ``params["shift"]``: with ``ones``, the rows ``(a_1, b_1)`` subtracted from every row first (the
    centered factor is the same; its rounding is relative to the shifted rows, not to the column means).
    ``params["shift_first"]`` (one source, no ``ones``: the column strips of a wide ``A`` with an intercept):
    ``[S - S[:, :1] 1^T | S[:, :1]]`` factored, each strip row less its first entry and that entry beside
    it: the leading block is the factor of ``(A - 1 a_1^T)^T`` (rounded relative to the columns' spread, not
    their means; :func:`blocklin.linalg.products.gram_kernels.gram_pass_kernel` has the same shift), the last
    column ``Q^H a_1`` (what the intercept needs of the shift: ``a_1^T x`` from the factor's ``R z``).

    The state holds the ``(n+k) x (n+k)`` upper-triangular factor of the rows seen so far, whose
    leading ``n x n`` block is ``R`` of ``A``, whose last ``k`` columns hold ``Q^T B`` and the
    residual factor ``T`` with ``||T e_j|| = min_x ||A x - b_j||``. On a GPU the factor stays on the
    device until the task's last strip.
    """
    if not device.host_resident:
        return _tsqr_on_device(device, arrays, rows, params, state), None
    a = np.asarray(arrays[0], dtype=params["dtype"])
    parts = [a]
    if len(arrays) > 1:
        parts.append(np.asarray(arrays[1], dtype=params["dtype"]))
    lead = [np.ones((a.shape[0], 1), params["dtype"])] if params.get("ones") else []
    strip = np.hstack(lead + parts) if len(lead + parts) > 1 else a
    width, n, j = strip.shape[1], a.shape[1], len(lead)
    if params.get("shift") is not None:  # the rows less the first row, in the stacked copy
        _shift(strip, j, n, params["shift"])
        a, parts = strip[:, j:j + n], [strip[:, j:j + n], strip[:, j + n:]]
    if params.get("shift_first"):  # [S - S[:, :1] 1^T | S[:, :1]], a new array (never the strip)
        with np.errstate(over="ignore", invalid="ignore"):
            a = strip - strip[:, :1]
        strip, parts, width = np.hstack([a, strip[:, :1]]), [a], width + 1
    if state is None:
        state = {"r": np.zeros((0, width), params["dtype"]), "aa": 0.0,
                 "bb": np.zeros(width - n - j - bool(params.get("shift_first")))}
    state["aa"] += sumsq(a)
    if len(parts) > 1:
        state["bb"] += sumsq_cols(parts[1])
    state["r"] = r_factor(np.vstack([state["r"], strip]))
    return state, None


def _shift(strip: Any, j: int, n: int, shift: Any) -> None:
    """``strip[:, j:j+n] -= a_1`` and ``strip[:, j+n:] -= b_1`` in place (``strip`` is the stacked copy)."""
    sa, sb = shift
    strip[:, j:j + n] -= sa[None, :]
    if strip.shape[1] > j + n:
        strip[:, j + n:] -= sb[None, :]


def reduce_r(states: list, width: int) -> np.ndarray:
    """The ``width x width`` R factor of all rows from the tasks' factors (in row order).

    Fewer rows than columns leave a trapezoid, padded with zero rows.
    """
    rs = [s["r"] for s in states if s is not None]
    r = r_factor(np.vstack(rs)) if len(rs) > 1 else rs[0]
    if r.shape[0] < width:
        r = np.vstack([r, np.zeros((width - r.shape[0], width), r.dtype)])
    return r
