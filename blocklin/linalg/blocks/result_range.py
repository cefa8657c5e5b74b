"""Results beyond their dtype's range: a solution or an inverse whose entries a float32 matrix cannot hold.

A nonsingular ``A`` whose entries sit near float32's smallest normal number (``1e-38``) has an inverse
near ``1e38`` or beyond, and ``x = A^-1 b`` is about ``||b|| / sigma_min(A)``: past float32's largest
(``3.4e38``) its substitutions overflow, and the overflow had been named a singular ``A``. These helpers
build the refusal that names the range instead, with the size the result would have; the routes measure
it on the failure path only (from the LU's pivots, or LAPACK's condition estimate).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def beyond(value: float, dtype: Any) -> bool:
    """Whether a magnitude (float64, ``inf`` where it left float64 too) is above ``dtype``'s largest."""
    return not value <= float(np.finfo(np.dtype(dtype)).max)


def wide_name(dtype: Any) -> str:
    """The dtype of the same kind in double precision (what a cast of the input gives)."""
    return "complex128" if np.dtype(dtype).kind == "c" else "float64"


def solution_range_error(name: str, dtype: Any, *, what: str, actual: str, fix: str) -> Exception:
    """The :class:`~blocklin.errors.ParameterError` for a result (``what``) beyond ``dtype``'s range, naming
    ``name``, the size found (``actual``) and ``fix``."""
    from blocklin.errors import ParameterError, explain

    fi = np.finfo(np.dtype(dtype))
    return ParameterError(explain(
        name, f"must give {what} within {fi.dtype.name}'s range (largest {float(fi.max):.3g}), the precision it is "
              f"computed in: A^-1 is about 1 / sigma_min(A) and x = A^-1 b about ||b|| / sigma_min(A), so a "
              f"nonsingular A with entries near {float(fi.tiny):.2g} has an inverse near {1 / float(fi.tiny):.2g} "
              "or beyond", actual, fix))


def lu_growth_error(max_a: float, max_u: float, dtype: Any, fix: str) -> Exception:
    """The :class:`~blocklin.errors.ParameterError` for an LU of ``A`` in its own ``dtype`` that overflowed:
    entries near the dtype's largest, which the elimination's growth passed (not a singular ``A``)."""
    from blocklin.errors import ParameterError, explain

    name = np.dtype(dtype).name
    return ParameterError(explain(
        "a", f"must keep its LU factors within {name}'s range (the elimination's growth max |U| / max |A| is a few "
        "times 1 for most matrices, up to 2^(n-1): entries near the largest value overflow)",
        f"max |A| = {max_a:.3g}, max |U| = {max_u:.3g} (the factorization overflowed)", fix))


def magnitude(value: float) -> str:
    """A float64 magnitude for a message (``inf``: beyond float64's range too)."""
    return f"{value:.3g}" if math.isfinite(value) else "beyond float64's range"


__all__ = ["beyond", "lu_growth_error", "magnitude", "solution_range_error", "wide_name"]
