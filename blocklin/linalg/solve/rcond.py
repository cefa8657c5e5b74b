"""The rank cut of ``numpy.linalg.lstsq``'s ``rcond``, LAPACK ``xGELSD``'s rule, for the real and complex routes.

NumPy hands ``rcond`` to ``xGELSD`` unchanged (``None`` becomes ``eps * max(m, n)``), whose ``xLALSD``
replaces an ``rcond`` at most 0 or at least 1 by the unit roundoff ``xLAMCH('E')`` (``eps / 2``): NumPy's
old default ``rcond=-1`` and ``rcond=0`` cut at ``eps / 2 * s_1``, never at 0 (every rounding-level
singular value inverted), and ``rcond >= 1`` keeps the same values, never none. Singular values at most
the cut count as zero.
"""

from __future__ import annotations

import numpy as np

from blocklin.errors import ParameterError, explain


def check_rcond(rcond: object) -> None:
    """Refuse what is not a finite real number or ``None`` (``xGELSD`` takes any finite number)."""
    if rcond is not None and not (isinstance(rcond, (int, float, np.integer, np.floating)) and not isinstance(rcond, bool)
                                  and np.isfinite(rcond)):
        raise ParameterError(explain("rcond", "must be a finite number or None", repr(rcond),
                                     "pass rcond=None (eps * max(m, n), NumPy's default)"))


def rank_cut(s: np.ndarray, m: int, n: int, rcond: float | None, dtype: np.dtype) -> float:
    """The absolute cut ``rcond' * s_1`` for singular values ``s`` (descending) of an ``m x n`` ``A``
    computed in ``dtype``: ``rcond' = eps * max(m, n)`` for ``None``, the unit roundoff ``eps / 2`` for an
    ``rcond`` outside ``(0, 1)`` (LAPACK's rule), else ``rcond``."""
    eps = float(np.finfo(dtype).eps)
    if rcond is None:
        ratio = eps * max(m, n)
    elif not 0.0 < float(rcond) < 1.0:
        ratio = eps / 2
    else:
        ratio = float(rcond)
    return ratio * (float(s[0]) if s.size else 0.0)
