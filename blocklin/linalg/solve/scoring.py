"""``scoring=`` of the cross-validated choice of lambda: scikit-learn's scorers from sums of the errors.

Each built-in scorer follows from five sums per held-out set, per lambda and right-hand side, which the
passes accumulate exactly (:class:`Stats`): the count ``n``, the errors' sum ``se``, their squares' sum
``sse``, their absolute values' sum ``sae`` and the targets' squared deviations from their own mean
``sst``. The scorers are scikit-learn's (``sklearn.metrics``), with its multi-output rule
``multioutput="uniform_average"`` (the mean over right-hand sides) unless one score per right-hand side
is asked for, its ``force_finite`` rule for a constant target (``r2`` and ``explained_variance``
are 1 where the numerator is 0 too, else 0; numerators and ``sst`` at their rounding level count as 0, and
``explained_variance`` of one row is 1: it has neither variance), and ``r2`` of fewer than two rows is NaN (a fold whose
every score is NaN never wins; where all are, the first grid value does, as ``GridSearchCV`` ranks them):

==============================  ============================================================
name                            score of one held-out set, per right-hand side
==============================  ============================================================
``neg_mean_squared_error``      ``-sse / n``
``neg_root_mean_squared_error`` ``-sqrt(sse / n)``
``neg_mean_absolute_error``     ``-sae / n``
``r2``                          ``1 - sse / sst``
``explained_variance``          ``1 - (sse / n - (se / n)^2) / (sst / n)``
==============================  ============================================================

A callable ``scoring(estimator, X, y)`` (a scikit-learn scorer) needs the predictions of every row: it is
called as ``RidgeCV``'s leave-one-out calls it, ``scoring(identity, predictions, y)`` (``identity.predict``
returns its input), on the leave-one-out predictions held in memory
(:mod:`blocklin.linalg.solve.loo`), or per fold on the predictions of a wide ``a``'s folds
(:mod:`blocklin.linalg.solve.kfold`).

Complex data (scikit-learn refuses it; the scorers' definitions with ``|.|``): the errors' sum ``se`` is
complex, ``sse = sum |r_i|^2``, ``sae = sum |r_i|``, ``sst = sum |y_i - ybar|^2``, so ``explained_variance``
subtracts ``|se / n|^2``; a callable is given the complex predictions and targets.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from blocklin.errors import ParameterError
from blocklin.errors import explain as _msg

#: The scorers computed from the sums (scikit-learn's names).
NAMES = ("neg_mean_squared_error", "neg_root_mean_squared_error", "neg_mean_absolute_error", "r2",
         "explained_variance")


def checked(scoring: Any) -> Any:
    """``scoring``: None (the route's default), one of :data:`NAMES`, or a callable ``(estimator, X, y)``."""
    if scoring is None or callable(scoring):
        return scoring
    if isinstance(scoring, str) and scoring.strip() in NAMES:
        return scoring.strip()
    raise ParameterError(_msg("scoring", f"must be None, one of {', '.join(NAMES)} (computed from sums of the "
                              "held-out errors), or a callable scorer(estimator, X, y)", repr(scoring),
                              "pass scoring='r2' or scoring='neg_mean_squared_error', or a callable made with "
                              "sklearn.metrics.make_scorer"))


@dataclasses.dataclass
class Stats:
    """Sums over the rows of held-out sets: arrays of one shape (``..., k``), ``n`` broadcast to it; with
    weights, every sum weighs row ``i`` by ``w_i`` and ``n`` is ``sum w`` (scikit-learn's weighted metrics).
    ``se`` is complex for complex data, the other sums real (of ``|r_i|^2``, ``|r_i|``, ``|y_i - ybar|^2``)."""

    n: Any
    se: np.ndarray
    sse: np.ndarray
    sae: np.ndarray | None
    sst: np.ndarray
    #: rows summed (``n`` is their weight): scikit-learn's ``r2`` of fewer than two rows is NaN
    rows: Any = None

    def scaled(self, e: int) -> Stats:
        """The sums of errors and targets multiplied by ``2^e`` (the problem solved in powers of two)."""
        if not e:
            return self
        return Stats(n=self.n, se=_ldexp(self.se, e), sse=np.ldexp(self.sse, 2 * e),
                     sae=None if self.sae is None else np.ldexp(self.sae, e), sst=np.ldexp(self.sst, 2 * e),
                     rows=self.rows)


def _ldexp(x: np.ndarray, e: int) -> np.ndarray:
    """``x 2^e`` (exact), of complex sums part by part (NumPy's ``ldexp`` takes real data only)."""
    if np.iscomplexobj(x):
        return np.ldexp(x.real, e) + 1j * np.ldexp(x.imag, e)
    return np.ldexp(x, e)


def _abs2(v: np.ndarray) -> np.ndarray:
    """``|v|^2`` (``v * v`` of real data, as it was)."""
    return (v * v.conj()).real if np.iscomplexobj(v) else v * v


def centered_squares(bb: np.ndarray, sb: np.ndarray, n: float, rows: float, size: np.ndarray) -> np.ndarray:
    """``sum w |y - ybar|^2 = bb - |sb|^2 / n`` from sums (``n`` their weight, ``rows`` their rows),
    zero where it is at the rounding level of the sums it came from (``size``: the largest of them):
    a constant target's. scikit-learn's ``force_finite`` rule then scores it (``r2`` 0 or 1), not the
    residue: a held-out fold with a constant target scored about ``-7e15``, and the choice of lambda
    went to the other end of the grid."""
    sst = np.maximum(bb - _abs2(sb) / n, 0.0)
    return np.where(sst <= 4 * (rows + 2) * np.finfo(np.float64).eps * np.abs(size), 0.0, sst)


def from_errors(err: np.ndarray, b: np.ndarray, w: np.ndarray | None = None) -> Stats:
    """The sums of one held-out set from its errors ``err`` (``rows x L x k``) and targets ``b`` (``rows x k``),
    weighted by ``w`` (the scorer's ``sample_weight``; None: every row 1); complex errors and targets sum
    ``|r_i|^2``, ``|r_i|`` and ``|y_i - ybar|^2``."""
    wv = np.ones(err.shape[0]) if w is None else np.asarray(w, dtype=np.float64)
    total = float(wv.sum())
    dev = b - wv @ b / total
    # a constant target's deviations are the rounding of its weighted mean, not 0: cut at that level as
    # centered_squares does (a one-row fold with weights had sst ~ 1e-32 and explained_variance 1.8e11)
    sst = wv @ _abs2(dev)
    sst = np.where(sst <= 4 * (err.shape[0] + 2) * np.finfo(np.float64).eps * (wv @ _abs2(b)), 0.0, sst)
    shape = err.shape[1:]
    we = wv[:, None, None] * err
    with np.errstate(invalid="ignore"):  # a zero weight's error (0/0) counts 0
        we = np.where(wv[:, None, None] > 0, we, 0.0)
        sq = we * err.conj() if np.iscomplexobj(err) else we * err
        return Stats(n=total, se=we.sum(axis=0), sse=np.where(wv[:, None, None] > 0, sq.real, 0.0).sum(axis=0),
                     sae=np.abs(we).sum(axis=0), sst=np.broadcast_to(sst, shape).copy(),
                     rows=err.shape[0])


def per_target(name: str | None, st: Stats) -> np.ndarray:
    """The score of ``name`` per right-hand side (``None``: minus the mean squared error, RidgeCV's
    leave-one-out default)."""
    n = np.asarray(st.n, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        if name in (None, "neg_mean_squared_error"):
            return -st.sse / n
        if name == "neg_root_mean_squared_error":
            return -np.sqrt(st.sse / n)
        if name == "neg_mean_absolute_error":
            return -st.sae / n
        num = st.sse / n if name == "r2" else st.sse / n - _abs2(st.se / n)
        den = st.sst / n
        rows = np.broadcast_to(np.asarray(st.rows if st.rows is not None else n, dtype=np.float64), num.shape)
        if name == "explained_variance":  # the errors' variance: 0 for one row, else cut at its rounding
            # (sse / n and |se / n|^2 cancel): one held-out row had scored 0 or 1 by that residue
            num = np.where((rows < 2) | (num <= 4 * (rows + 2) * np.finfo(np.float64).eps * st.sse / n), 0.0, num)
            den = np.where(rows < 2, 0.0, den)
        ratio = np.where(den != 0, 1.0 - num / np.where(den != 0, den, 1.0), np.where(num == 0, 1.0, 0.0))
    if name == "r2" and np.any(rows < 2):  # scikit-learn's r2_score of fewer than two rows: NaN
        ratio = np.where(np.broadcast_to(rows, ratio.shape) < 2, np.nan, ratio)
    return ratio


def in_units(name: str | None, scores: Any, e: Any) -> np.ndarray:
    """Scores of the problem divided by ``2^e`` (:func:`per_target` of unscaled sums) in the units of the
    problem given, exactly: squared errors ``4^e``, errors ``2^e``, ``r2`` and ``explained_variance`` as
    they are. The choice of lambda reads the scores before this (the same order: a power of two is
    monotone), where the sums are in range: near ``2^+-700`` the rescaled sums of squares overflowed or
    underflowed, every ``r2`` read ``nan`` or ``1`` and the first grid value won the tie."""
    scores = np.asarray(scores, dtype=np.float64)
    e = np.asarray(e, dtype=np.int64)  # one power, or one per right-hand side (the last axis)
    if not np.any(e) or name in ("r2", "explained_variance"):
        return scores
    with np.errstate(over="ignore", under="ignore"):
        return np.ldexp(scores, 2 * e if name in (None, "neg_mean_squared_error") else e)


def own_powers(top: Any, eb: int) -> np.ndarray | None:
    """A power of two per right-hand side, ``c_j`` with ``top_j 2^-(eb + c_j)`` in ``[0.5, 1)`` (``top``: each
    column's largest magnitude in the units given, ``2^eb``: the one power ``b`` is scaled by), where some
    column's ``top_j 2^-eb`` lies outside :func:`~blocklin.linalg.blocks.scaling.safe_range` (its squares, the
    sums the scores are made of, leave float64's range); None where every column's are in range."""
    from blocklin.linalg.blocks.scaling import safe_range

    top = np.asarray(top, dtype=np.float64).ravel()
    ok = np.isfinite(top) & (top > 0)
    with np.errstate(under="ignore", over="ignore"):
        scaled = np.ldexp(np.where(ok, top, 1.0), -int(eb))
    low, high = safe_range(np.float64)
    if not np.any(ok & ((scaled < low) | (scaled > high))):
        return None
    return np.where(ok, np.frexp(scaled)[1], 0).astype(np.int64)


def units(sb: Any, ce: np.ndarray | None = None) -> tuple[int, np.ndarray | None]:
    """``(eb, ce)``: the power of two ``2^eb`` the sums of a choice of lambda are kept in, and per right-hand side
    the power ``2^ce_j`` column ``j``'s own sums are divided by besides it (None: none). Where the passes divided
    each column of ``b`` by its own power (:attr:`~blocklin.linalg.blocks.scaling.Scaling.columns`, columns too
    far apart for one), ``eb`` is the largest column's and ``ce`` each column's shift from it
    (:attr:`~blocklin.linalg.blocks.scaling.Scaling.column_shift`); else ``b``'s one power and the ``ce`` given
    (:func:`own_powers`: each column's errors divided by their own power before they are squared)."""
    if sb is None:
        return 0, ce
    if sb.columns is not None:
        return sb.largest, sb.column_shift
    return sb.exponent, ce


def combine(scores: np.ndarray, per_column: bool) -> np.ndarray:
    """The mean over right-hand sides (the last axis), or the scores as they are (one per right-hand side)."""
    return scores if per_column else scores.mean(axis=-1)


class Identity:
    """The estimator a callable scorer is given: its ``predict`` returns the predictions it is handed
    (scikit-learn's ``_IdentityRegressor`` in ``RidgeCV``'s leave-one-out)."""

    def predict(self, x: Any) -> Any:
        return x


def identity() -> Any:
    """An :class:`Identity` that scikit-learn's scorers take for a regressor (they read its tags) where
    scikit-learn is installed, else the plain one."""
    try:
        from sklearn.base import BaseEstimator, RegressorMixin
    except ImportError:
        return Identity()

    class _Regressor(RegressorMixin, BaseEstimator, Identity):
        pass

    return _Regressor()


def call(scoring: Any, predictions: np.ndarray, b: np.ndarray, one_d: bool, w: np.ndarray | None = None) -> float:
    """A callable scorer on predictions and targets (``rows x k``; a 1-D target as scikit-learn gives it), with
    ``sample_weight=w`` where given (as ``RidgeCV`` passes it to its scorer)."""
    if one_d:
        predictions, b = predictions[:, 0], b[:, 0]
    value = scoring(identity(), predictions, b) if w is None else scoring(identity(), predictions, b, sample_weight=w)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ParameterError(_msg("scoring", "a callable must return one number", repr(value),
                                  "return a float (e.g. from sklearn.metrics.make_scorer)")) from None


__all__ = ["NAMES", "Identity", "Stats", "identity", "call", "checked", "combine", "from_errors", "per_target", "units"]
