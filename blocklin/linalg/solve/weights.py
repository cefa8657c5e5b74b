"""``sample_weight`` of a Tikhonov solve: the operand, its checks, and what the weighted problem is.

The weighted problem is scikit-learn's ``Ridge.fit(X, y, sample_weight=w)`` (``sklearn/linear_model/
_ridge.py``, ``_preprocess_data(..., rescale_with_sw=True)``):
``min sum_i w_i (a_i^T x + x0 - b_i)^2 + lam^2 ||x||^2``, that is the rows of ``A`` and ``b`` scaled by
``sqrt(w_i)`` as they are read (never on disk) and, with ``fit_intercept``, centered by the weighted
means ``mu = A^T w / sum w``, ``bbar = b^T w / sum w``. The weights are ``m`` values ``>= 0``, finite,
not all zero; one pass over them alone (``8 m`` bytes read) checks that before ``A`` is read.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from blocklin.errors import NonFiniteError, ParameterError, ShapeError
from blocklin.errors import explain as _msg
from blocklin.linalg.solve.kernels import weight_check_kernel
from blocklin.runtime.job import Job
from blocklin.runtime.passes import run_pass, source


def weight_operand(job: Job, sample_weight: Any, m: int) -> Any:
    """``sample_weight`` as a stored ``m x 1`` operand (a NumPy, Dask or stored vector, or a column)."""
    stored = isinstance(sample_weight, (str, os.PathLike))  # a path or URL (np.isscalar says True of a str)
    if not stored and (np.isscalar(sample_weight) or (isinstance(sample_weight, np.ndarray)
                                                      and sample_weight.ndim == 0)):
        raise ParameterError(_msg("sample_weight", "must be a vector of one weight per row of a", repr(sample_weight),
                                  "pass sample_weight=np.full(m, w); a constant weight c is the same as lam / "
                                  "sqrt(c) without weights"))
    if isinstance(sample_weight, (list, tuple)):
        sample_weight = np.asarray(sample_weight)
    if isinstance(sample_weight, np.ndarray) and sample_weight.dtype.kind not in "biuf":
        raise ParameterError(_msg("sample_weight", "must hold real numbers", f"dtype {sample_weight.dtype}",
                                  "pass a float array"))
    w = job.operand(sample_weight, "sample_weight", integers="cast")
    if w.shape[1] != 1 or w.shape[0] != m:
        raise ShapeError(_msg("sample_weight", "must have one weight per row of a (a vector of length m, or an "
                              "m x 1 column)", f"shape {w.shape} for a with {m} rows",
                              f"pass a vector of length {m}"))
    if np.dtype(w.dtype).kind != "f":
        raise ParameterError(_msg("sample_weight", "must hold real numbers", f"dtype {w.dtype}",
                                  "pass a float array"))
    return w


def check_weights(job: Job, W: Any) -> tuple[float, int]:
    """``(sum w, number of w > 0)`` after checking ``w``: finite, ``>= 0``, not all zero (one pass over it)."""
    states, _ = run_pass(job, weight_check_kernel, [source(W)], {}, check_finite=False, over="sample_weight",
                         description="sample_weight check")
    states = [s for s in states if s is not None]
    bad = sum(s["bad"] for s in states)
    if bad:
        first = min(s["first_bad"] for s in states if s["first_bad"] >= 0)
        raise NonFiniteError(_msg("sample_weight", "must be finite", f"{bad} NaN or Inf value(s), the first at "
                                  f"row {first}", "clean the weights (a row to leave out takes weight 0)"))
    low = min(states, key=lambda s: s["min"])
    if low["min"] < 0:
        raise ParameterError(_msg("sample_weight", "must be >= 0 (a weight multiplies a squared residual)",
                                  f"{low['min']!r} at row {low['argmin']}",
                                  "pass nonnegative weights (0 leaves a row out)"))
    total, positive = float(sum(s["sum"] for s in states)), int(sum(s["positive"] for s in states))
    if positive == 0 or not total > 0:
        raise ParameterError(_msg("sample_weight", "must have a positive weight somewhere", "all zero",
                                  "give the rows to fit a positive weight"))
    return total, positive


__all__ = ["check_weights", "weight_operand"]
