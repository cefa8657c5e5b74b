"""The co-moments of rows of a stored sparse matrix: what an updatable ``svd``/``pca`` of one keeps.

The count, column means and centered Gram ``C = (S - 1 mu^T)^T (S - 1 mu^T)`` (float64, ``n x n``) of
rows ``r0:r1``, as :func:`blocklin.linalg.blocks.center.moments_and_gram` gives them of a dense
matrix: each strip of rows densified within the budget, centered by its own means and its Gram
formed, the strips' co-moments merged by Chan, Golub and LeVeque's pairwise update, so the result is
as accurate as the Gram of the centered rows whatever the size of the means. The kept co-moments of
an updatable result and those of rows appended later (:mod:`blocklin.linalg.update.svd`) are both
made here.

References
----------
T. F. Chan, G. H. Golub, R. J. LeVeque, "Algorithms for computing the sample variance: analysis and
recommendations", The American Statistician 37(3), 1983.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.config import format_size
from blocklin.errors import BudgetError, explain
from blocklin.linalg.blocks.center import Moments, merge_comoments, nonzero_columns

#: Dense float64 copies of a strip held at once: the strip, its deviations' Gram temporaries.
_STRIP_COPIES = 3


def check_comoments_budget(n: int, memory: int) -> None:
    """Refuse, with the budget it needs, a ``memory`` that cannot hold the ``n x n`` co-moments twice (the
    accumulator and a strip's Gram) and a dense row: before a run whose result keeps them."""
    need = 2 * 8 * n * n + _STRIP_COPIES * 8 * max(n, 1)
    if memory < need:
        raise BudgetError(explain("memory", "must hold the n x n co-moments of an updatable sparse result twice "
                                  f"and a dense row of the matrix (n = {n})", format_size(memory),
                                  f"pass memory='{format_size(need)}' or more, or updatable=False"), minimum=need)


def sparse_comoments(s: Any, r0: int, r1: int, memory: int) -> tuple[Moments, np.ndarray]:
    """``(moments, C)`` of rows ``r0:r1`` of the stored sparse matrix ``s`` (a
    :class:`~blocklin.sparse.SparseMatrix`), read in dense strips within ``memory`` beside the ``n x n``
    accumulator and its merge term. Refused with the budget it needs where one row does not fit."""
    n = int(s.shape[1])
    check_comoments_budget(n, memory)
    per_row = _STRIP_COPIES * 8 * max(n, 1)
    step = max(1, (memory - 2 * 8 * n * n) // per_row)
    cnt, mean, c = 0, np.zeros(n), np.zeros((n, n))
    nonzero = np.zeros(n, bool)  # a column's nonzero entries, which its moments lose where they underflow
    for a in range(r0, r1, step):
        b = min(r1, a + step)
        strip = s.rows(a, b).toarray().astype(np.float64, copy=False)
        mu = strip.mean(axis=0)
        nonzero |= nonzero_columns(strip, mu)
        strip -= mu
        cs = strip.T @ strip
        cnt, mean, c = (b - a, mu, cs) if cnt == 0 else merge_comoments(cnt, mean, c, b - a, mu, cs)
    c = (c + c.T) / 2  # the Gram's two triangles agree to the last bit
    return Moments(mean, np.maximum(np.diag(c), 0.0) / max(cnt, 1), cnt, nonzero), c


__all__ = ["check_comoments_budget", "sparse_comoments"]
