"""Validation of the arguments every entry point shares, written once (scipy's ``_iv`` pattern).

One validator per kind of argument; each raises the error of :mod:`blocklin.errors` with a message
built by :func:`~blocklin.errors.explain` (the parameter, the rule, the actual value, a fix), and
returns the normalized value.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.errors import explain


def check_k(k: Any, m: int, n: int) -> int:
    """``k`` wanted pairs of an ``m x n`` matrix: an integer with ``1 <= k < min(m, n)``."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(explain("k", "must be an integer", repr(k), "pass k=10"))
    if not 1 <= k < min(m, n):
        raise ValueError(explain("k", f"must satisfy 1 <= k < min(m, n) = {min(m, n)}", f"k={k} for a {m} x {n} "
                                 "matrix", f"pass 1 <= k <= {min(m, n) - 1} (use scipy.linalg.svd / eigh for a "
                                 "full decomposition)"))
    return int(k)


def resolve_seed(seed: Any) -> int:
    """A non-negative integer seed; ``None`` draws one (to be recorded in the report)."""
    if seed is None:
        return int(np.random.SeedSequence().entropy % (2**63))
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and seed >= 0:
        return int(seed)
    raise ValueError(explain("seed", "must be a non-negative integer or None", repr(seed), "pass seed=0"))
