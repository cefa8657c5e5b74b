"""Squeezing ``A`` into a 16-bit format before a ``precision="fp16"``/``"bf16"`` factorization.

Higham, Pranesh and Zounon (2019), "Squeezing a matrix into half precision, with an application to
solving linear systems", SISC 41(4): two-sided diagonal scaling (their Algorithm 2.2: rows, then
columns, equilibrated to a largest entry of 1; for a symmetric matrix the symmetric scaling
``D A D``, from the diagonal for a positive definite one as Higham and Pranesh 2021, Alg. 3.1)
followed by a multiplication by ``mu = theta x_max``, so that the factorization's operands use
the format's range instead of overflowing above 65504 or flushing below ``6e-8``. The scale
factors here are powers of two (as LAPACK's ``dgeequb``), so the scaling itself is exact, and
``mu = 2^12`` for fp16 (``theta`` about 1/16: the LU's growth stays in range up to a growth factor of
16) and 1 for bf16, whose exponent range is float32's.

Three passes over ``A`` (row maxima, column maxima of the row-scaled matrix, the scaled float32 copy),
each a tile graph of the job; the copy is what the factorization reads.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from blocklin.device.half import FORMATS, round_to
from blocklin.errors import ParameterError, explain
from blocklin.runtime.blockops import BlockOps, Region
from blocklin.runtime.tiles import open_array, with_task_settings
from blocklin.storage.zarr_store import write_block

#: ``mu`` per format (see the module notes).
MU = {"fp16": 2.0 ** 12, "bf16": 1.0}


@dataclasses.dataclass(frozen=True)
class HalfScaling:
    """``A_s = mu * diag(row) A diag(col)``, stored in float32 (``path``), and what the scaling saw."""

    path: Any
    row: np.ndarray
    col: np.ndarray
    mu: float
    #: ``max |a_ij|`` of ``A``.
    max_abs: float
    #: ``||A_s - fl(A_s)||_F / ||A_s||_F``: the relative perturbation of rounding ``A_s`` to the format.
    rounding: float
    #: ``A_s + mu shift I`` was factored (a shifted Cholesky; 0: none).
    shift: float = 0.0
    #: A lower bound of ``||A_s||_2``: ``max(max |A_s|, ||A_s||_F / sqrt(n))``.
    norm_lower: float = 0.0

    def to_dict(self) -> dict:
        return {"scheme": "two-sided diagonal scaling (Higham, Pranesh, Zounon 2019), powers of two",
                "mu": self.mu, "row_scale_range": _range(self.row), "col_scale_range": _range(self.col),
                "rounding_perturbation": self.rounding, "diagonal_shift": self.shift}


def _range(v: np.ndarray) -> list[float]:
    return [float(v.min()), float(v.max())] if v.size else [1.0, 1.0]


def squeeze(ops: BlockOps, a: Region, out: Region, chunks: tuple[int, int], mode: str, *,
            symmetric: bool, positive: bool = False, shift: float = 0.0) -> HalfScaling:
    """Scale ``a`` (``n x n``) into ``out`` (an existing float32 store of ``chunks``, those tiles being
    the tasks' blocks: each writes whole chunks); refuse where the scaled matrix still underflows
    (:func:`check_rounding`). ``shift``: added to the scaled diagonal (``mu`` times it: the
    shifted Cholesky of Higham and Pranesh 2021, where the low-precision Cholesky of ``A_s`` broke down).
    ``positive`` (``assume_a="pos"``): the symmetric scaling from the diagonal, ``d_i`` a power of two
    near ``a_ii^(-1/2)`` (Higham and Pranesh 2021, Alg. 3.1: ``|a_ij| <= sqrt(a_ii a_jj)``, so every
    entry of ``D A D`` is below 1), where every ``a_ii`` is positive; the row maxima's scaling of a
    symmetric matrix (``d_i = m_i^(-1/2)``) leaves ``D A D`` of a positive definite matrix with one line
    ``2^20`` times the rest as ill-conditioned as it (an off-diagonal entry sets the other rows' maxima),
    which GMRES-IR then refused."""
    n = a.shape[0]
    rows = [(r0, min(n, r0 + chunks[0])) for r0 in range(0, n, chunks[0])]
    cols = [(c0, min(n, c0 + chunks[1])) for c0 in range(0, n, chunks[1])]
    blocks = [(i, j, rs, cs) for i, rs in enumerate(rows) for j, cs in enumerate(cols)]
    spec = ops.spec(np.float64, a=a, out=out)
    g = ops.graph("rowmax", spec)
    for i, j, rs, cs in blocks:
        g.add((i, j), rowmax_task, spec, rs, cs)
    rowmax, diag = np.zeros(n), np.zeros(n)
    for r in ops.run(g, "row maxima of |A|"):
        r0, v = r["rows"]
        np.maximum(rowmax[r0:r0 + v.size], v, out=rowmax[r0:r0 + v.size])
        if "diag" in r:
            d0, dv = r["diag"]
            diag[d0:d0 + dv.size] = dv
    max_abs = float(rowmax.max()) if n else 0.0
    if positive and bool(np.all((diag > 0) & np.isfinite(diag))):  # |a_ij| d_i d_j <= sqrt(a_ii a_jj) d_i d_j < 1
        row = col = _pow2(diag, half=True)
    elif symmetric:  # |a_ij| d_i d_j <= sqrt(m_i m_j) d_i d_j < 1
        row = col = _pow2(rowmax, half=True)
    else:
        row = _pow2(rowmax)
        g = ops.graph("colmax", spec, row)
        for i, j, rs, cs in blocks:
            g.add((i, j), colmax_task, spec, rs, cs, row[rs[0]:rs[1]])
        colmax = np.zeros(n)
        for r in ops.run(g, "column maxima of |diag(row) A|"):
            c0, v = r["cols"]
            np.maximum(colmax[c0:c0 + v.size], v, out=colmax[c0:c0 + v.size])
        col = _pow2(colmax)
    mu = MU[mode]
    g = ops.graph("squeeze", spec, row, col, mu, mode, shift)
    for i, j, rs, cs in blocks:
        g.add((i, j), squeeze_task, spec, rs, cs, row[rs[0]:rs[1]], col[cs[0]:cs[1]], mu, mode, mu * shift)
    res = ops.run(g, f"A scaled into {mode}'s range")
    ss, se = sum(r["sumsq"] for r in res), sum(r["err_sumsq"] for r in res)
    rounding = float(np.sqrt(se / ss)) if ss > 0 else 0.0
    check_rounding(rounding, mode)
    lower = max(max((r["max"] for r in res), default=0.0), float(np.sqrt(ss / max(n, 1))))
    return HalfScaling(out.path, row, col, mu, max_abs, rounding, shift, lower)


def check_rounding(rounding: float, mode: str) -> None:
    """Refuse a scaled matrix that the format still cannot hold.

    Rounding to nearest perturbs every entry in the format's normal range by at most ``u |a_ij|``,
    so ``||A_s - fl(A_s)||_F <= u ||A_s||_F``; a perturbation above ``2 u ||A_s||_F`` comes from
    entries that overflowed or underflowed (lost to zero or to subnormals' few bits), which the
    factorization would see as a different matrix.
    """
    u = FORMATS[mode]["u"]
    if not rounding <= 2 * u:
        raise ParameterError(explain(
            "precision", f"'{mode}' needs A, after scaling into {mode}'s range (Higham, Pranesh, Zounon 2019), "
            f"to round to {mode} with a relative perturbation of at most 2u = {2 * u:.2g} (entries beyond the "
            "range overflow or flush to zero)", f"||A_s - fl(A_s)||_F / ||A_s||_F = {rounding:.3g} (A's entries "
            "span more magnitudes than the format holds)", "pass precision='mixed' (a float32 factorization) or "
            "'bf16' (float32's range)"))


def _pow2(m: np.ndarray, half: bool = False) -> np.ndarray:
    """Powers of two ``s`` with ``m s < 1`` (``m s^2 < 1`` with ``half``); 1 where ``m`` is 0 or not finite."""
    ok = (m > 0) & np.isfinite(m)
    e = np.frexp(np.where(ok, m, 1.0))[1]  # m = f 2^e, f in [0.5, 1)
    e = np.where(ok, e, 0)
    return np.ldexp(1.0, -((e + 1) // 2 if half else e))


@with_task_settings
def rowmax_task(spec: Any, rs: tuple[int, int], cs: tuple[int, int]) -> dict:
    """Row maxima of ``|A[rs, cs]|``, and the part of ``A``'s diagonal the block holds."""
    x = spec.a.read_stored(slice(*rs), slice(*cs), np.float64)
    out = {"bytes_read": x.nbytes, "rows": (rs[0], np.abs(x).max(axis=1, initial=0.0))}
    lo, hi = max(rs[0], cs[0]), min(rs[1], cs[1])
    if lo < hi:  # the block holds part of the diagonal
        k = np.arange(lo, hi)
        out["diag"] = (lo, x[k - rs[0], k - cs[0]].copy())
    return out


@with_task_settings
def colmax_task(spec: Any, rs: tuple[int, int], cs: tuple[int, int], row: np.ndarray) -> dict:
    """Column maxima of ``|diag(row) A[rs, cs]|``."""
    x = spec.a.read_stored(slice(*rs), slice(*cs), np.float64)
    return {"bytes_read": x.nbytes, "cols": (cs[0], np.abs(x * row[:, None]).max(axis=0, initial=0.0))}


@with_task_settings
def squeeze_task(spec: Any, rs: tuple[int, int], cs: tuple[int, int], row: np.ndarray, col: np.ndarray, mu: float,
                 mode: str, shift: float = 0.0) -> dict:
    """Block ``[rs, cs]`` of ``A_s = mu diag(row) A diag(col)`` written in float32 (whole chunks), with its
    sum of squares and that of its rounding error to ``mode``."""
    x = spec.a.read_stored(slice(*rs), slice(*cs), np.float64)
    y = (mu * row)[:, None] * x * col[None, :]  # exact scaling (powers of two)
    lo, hi = max(rs[0], cs[0]), min(rs[1], cs[1])
    if shift and lo < hi:  # the block holds part of the diagonal
        k = np.arange(lo, hi)
        y[k - rs[0], k - cs[0]] += shift
    y = y.astype(np.float32)
    write_block(open_array(spec.out.path, mode="r+"), slice(*rs), slice(*cs), y)
    e = (y - round_to(y, mode)).astype(np.float64)
    y64 = y.astype(np.float64)
    return {"bytes_read": x.nbytes, "sumsq": float(np.einsum("ij,ij->", y64, y64)),
            "max": float(np.abs(y64).max(initial=0.0)),
            "err_sumsq": float(np.einsum("ij,ij->", e, e)) if np.isfinite(e).all() else np.inf}


__all__ = ["HalfScaling", "MU", "check_rounding", "squeeze"]
