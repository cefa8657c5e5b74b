"""Helpers of the ported peer suites (tests/conformance): results as NumPy, budgets that force tiles.

The peers' tests run on arrays in memory; blocklin runs the same data twice, in memory and at the
least budget its planner accepts (:func:`least_budget`), where every step streams or tiles.
"""

from __future__ import annotations

import numpy as np

import blocklin as bl
from blocklin.errors import BudgetError

__all__ = ["dense", "least_budget", "run", "lu_parts", "flip"]


def dense(x):
    """A stored ``Matrix`` (or anything array-like) as a NumPy array."""
    if x is None:
        return None
    return x[...] if isinstance(x, bl.Matrix) else np.asarray(x)


def least_budget(call):
    """``call(memory)`` at the least budget it plans at: a refusal at 1 KiB names its minimum
    (``BudgetError.minimum``), and the call runs there, out of core (tiles, strips, several passes)."""
    memory = "1KiB"
    for _ in range(4):
        try:
            return call(memory)
        except BudgetError as err:
            nxt = err.minimum if err.minimum else None
            if nxt is None:
                raise
            # a minimum that still refuses is retried once more at the larger minimum it names
            memory = max(int(nxt), 2 * int(memory) if isinstance(memory, int) else int(nxt))
    return call(memory)


def run(call, memory):
    """``call(memory)`` with the budget of a parametrization: ``None`` in memory, ``"least"`` out of core."""
    if memory == "least":
        return least_budget(call)
    return call(memory)


def run_checked(call, memory):
    """:func:`run`, asserting the route: out of core at ``"least"``, in core otherwise."""
    res = run(call, memory)
    assert res.report["in_core"] is (memory != "least")
    return res


def lu_parts(f, pivots):
    """SciPy's ``P, L, U`` (``A = P L U``) from the packed ``getrf`` factor and its 0-based pivots."""
    f = dense(f)
    m, n = f.shape
    k = min(m, n)
    lo = np.tril(f, -1)[:, :k] + np.eye(m, k, dtype=f.dtype)
    up = np.triu(f)[:k]
    perm = np.arange(m)
    for i, p in enumerate(np.asarray(pivots)[:k]):
        perm[[i, p]] = perm[[p, i]]
    p_mat = np.eye(m, dtype=f.dtype)[:, perm]  # rows of A = P (L U): A[perm] = L U
    return p_mat, lo, up


def flip(u, vt):
    """scikit-learn's ``svd_flip(u, v, u_based_decision=True)`` on NumPy copies (signs only)."""
    from sklearn.utils.extmath import svd_flip

    return svd_flip(np.array(dense(u)), np.array(dense(vt)))
