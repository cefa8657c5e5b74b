"""The peaks of a block: the largest magnitude of each of its columns, or of the whole.

What a job's first row pass over an input scans (:mod:`blocklin.runtime.passes`), for the scaling of
data near overflow or underflow, and what a writer that sees every value records beside its output
(:mod:`blocklin.storage.recorded_peaks`), so that a later job need not scan. Complex values count by
``max(|Re|, |Im|)``, within ``sqrt(2)`` of the modulus, which a power-of-two scaling allows. Maxima are
exact in any order and blocking: the peaks of a matrix are the same bits whoever took them.
"""

from __future__ import annotations

import numpy as np

#: Elements per row of the view in which :func:`column_peaks` reduces a narrow strip.
FOLD_ELEMENTS = 4096


def column_peaks(v: np.ndarray) -> np.ndarray:
    """``max |v|`` of each column, float64, without a temporary the size of ``v`` (NaN where a column
    holds one: it propagates through max and min).

    NumPy reduces a C-ordered ``h x n`` block over its rows one row at a time, an inner loop of ``n``
    elements: for narrow strips the loop's overhead, not the data, sets the rate. A C-contiguous strip
    is therefore reduced as ``h / r`` rows of ``r`` of its rows side by side (``r n`` about
    :data:`FOLD_ELEMENTS`), then over the ``r``. Maxima are exact in any order: the same peaks.
    Measured on the 2-core machine (4 M elements, max and min): 64 float32 columns 2.3 GB/s row by
    row, 24.8 folded; 16 float64 1.4 and 9.4; 512 float64 7.4 and 10.1.
    """
    if v.shape[0] == 0:
        return np.zeros(v.shape[1])
    if v.dtype.kind == "c":  # max(|Re|, |Im|): within sqrt(2) of the largest modulus, which a scaling allows
        if v.flags.c_contiguous:  # real and imaginary parts as adjacent real columns
            return column_peaks(v.view(v.real.dtype)).reshape(v.shape[1], 2).max(axis=1)
        return np.maximum(column_peaks(v.real), column_peaks(v.imag))
    hi, lo = column_max_min(v)
    return signed_peaks(hi, lo)


def signed_peaks(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """``max(hi, -lo)`` of the columns' maxima ``hi`` and minima ``lo``, float64 (NaN where either is),
    ``+0.0`` where both are zeros: a max of ``+0.0`` and ``-0.0`` returns either, so a column of zeros of
    both signs had ``-0.0`` for its peak or ``+0.0`` by the order its blocks came in; ``np.abs(x).max()``
    is ``+0.0``, whoever takes it."""
    peaks = np.maximum(hi.astype(np.float64), -lo.astype(np.float64))
    peaks += 0.0  # -0.0 + 0.0 is +0.0; every other value, NaN included, as it was
    return peaks


def row_peaks(v: np.ndarray) -> np.ndarray:
    """``max |v|`` of each row, float64 (NaN where a row holds one): the column peaks of ``v^T``, what an
    SVD of a wide matrix streams (its stored rows are the columns of ``B = A^T``)."""
    return column_peaks(v.T)


def block_peaks(v: np.ndarray, rows: bool) -> np.ndarray:
    """Each row's peak of ``v`` (``rows``) or each column's (:func:`row_peaks`, :func:`column_peaks`)."""
    return row_peaks(v) if rows else column_peaks(v)


def column_max_min(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each column's max and min (see :func:`column_peaks`; NaN propagates through both)."""
    h, n = v.shape
    r = FOLD_ELEMENTS // max(1, n) if v.flags.c_contiguous else 1
    whole = h // r * r if r > 1 else 0
    if not whole:
        return v.max(axis=0), v.min(axis=0)
    folded = v[:whole].reshape(whole // r, r * n)
    hi = folded.max(axis=0).reshape(r, n).max(axis=0)
    lo = folded.min(axis=0).reshape(r, n).min(axis=0)
    if whole < h:
        np.maximum(hi, v[whole:].max(axis=0), out=hi)
        np.minimum(lo, v[whole:].min(axis=0), out=lo)
    return hi, lo


def max_nan(values: list) -> np.ndarray | None:
    """The elementwise largest of the arrays ``values`` (``None`` for none), NaN where any is NaN."""
    if not values:
        return None
    return np.maximum.reduce([np.asarray(x, dtype=np.float64) for x in values])  # maximum propagates NaN


def flat_peaks(v: np.ndarray) -> np.ndarray:
    """``max |v|`` over the whole block, float64, as a row of its columns' count (NaN where ``v`` holds one:
    it propagates through max and min); what a first pass records where no caller asked for each
    column's (:attr:`Job.column_peaks <blocklin.runtime.job.Job.column_peaks>`). One max and one min of
    the block as a flat array: NumPy reduces a contiguous block at about 70 GB/s from the cache, a
    column-wise one at about 17 (the 2-core machine, 1 MiB of float64)."""
    n = v.shape[1]
    if not v.size:
        return np.zeros(n)
    if v.dtype.kind == "c":  # max(|Re|, |Im|), as column_peaks
        v = v.view(v.real.dtype) if v.flags.c_contiguous else np.stack((v.real, v.imag))
    return np.full(n, np.maximum(np.float64(v.max()), -np.float64(v.min())) + 0.0)  # as signed_peaks
