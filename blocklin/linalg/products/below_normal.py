"""Products whose every entry lies below the normal numbers: refused by name, as those beyond the range are.

A product ``alpha op(A) op(B) + beta C`` of operands near ``2^-520`` in float64 (``2^-70`` in float32) has
terms ``a_il b_lj`` below the smallest normal number ``2^minexp``: each is rounded to the subnormals' fixed
spacing ``2^(minexp - nmant)``, so the result keeps few digits (``3e-11`` relative at ``2^-520``, ``3e-5`` at
``2^-530``) or none (an all-zero product at ``2^-600``), where ``gram`` of the same data refuses.

The rule refused is the one the data fix: every entry of the exact product is below the normal numbers
wherever ``|alpha| k max |a| max |b| + |beta| max |c| < 2^minexp`` (each term of a sum of ``k`` is at most
``max |a| max |b|`` in magnitude), or where a tighter rigorous bound on every ``|c_ij|`` is: a sparse operand's
``c max |s| max |b|``, ``c`` the most stored entries of a row or column (the terms an entry sums), and a dense
operand's ``sum_l max_i |a_il| max |b|`` from the column peaks its writer recorded. Only then: with underflow the model of floating-point arithmetic gains an
absolute error of at most half the smallest subnormal, ``u 2^minexp``, per product (Higham 2002, sec. 2.1,
eq. 2.8; sums of subnormals are exact), so an entry's error grows by at most ``k u 2^minexp``, within the
norm-wise bound ``gamma_k |alpha| |A||B|`` wherever that bound reaches the normal numbers. A product whose
bound does, and whose entries merely cancel to small values, is kept: its error is the usual one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

#: The computed bound's relative error (a product of four factors' significands and a sum of two terms: five
#: roundings of ``u = 2^-53``) is far under this margin, by which it must be below ``2^minexp`` to be refused.
_MARGIN = 2.0 ** -48


def shortfall(terms: Sequence[Sequence[Callable[[], float]]], dtype: Any) -> tuple[int, int] | None:
    """``(e, p)`` where the sum over ``terms`` of the products of their factors (each a callable giving a
    finite magnitude, called lazily: a term stops at its first zero factor, so a zero ``alpha`` or ``k``
    reads no operand) is nonzero and below ``dtype``'s smallest normal number ``2^minexp`` by more than the
    bound's rounding: ``e``, with the sum below ``2^e``, and ``p``, the power of two that puts it near
    ``2^(maxexp / 2)`` (room both ways: the entries may lie far below the bound). None elsewhere."""
    fi = np.finfo(np.dtype(dtype))
    parts = []
    for term in terms:
        m, e = 1.0, 0
        for factor in term:
            f = float(factor())
            if f == 0:
                break
            fm, fe = np.frexp(f)  # exponents summed: the product itself may lie below float64's range
            m, e = m * float(fm), e + int(fe)
        else:
            parts.append((m, e))
    if not parts:  # every term has a zero factor: the product is exactly 0 (or beta C alone, zero too)
        return None
    # each term relative to 2^minexp: near 1 these are exact shifts; far below they may flush to 0, still below
    rel = sum(float(np.ldexp(m, e - fi.minexp)) for m, e in parts)
    if not rel * (1 + _MARGIN) < 1.0:
        return None
    top = max(e + int(np.frexp(m)[1]) for m, e in parts)  # the sum is below 2^(top + 1)
    return top + 1, fi.maxexp // 2 - (top + 1)


def refusal(name: str, dtype: Any, e: int, p: int, actual: str, fix: str) -> Exception:
    """The :class:`~blocklin.errors.ParameterError` for a product below ``dtype``'s normal numbers (bound
    ``2^e``, ``p`` the power of two that brings it in range), naming ``name``, ``actual`` and ``fix``."""
    from blocklin.errors import ParameterError, explain

    fi = np.finfo(np.dtype(dtype))
    return ParameterError(explain(
        name, f"must give a product within {fi.dtype.name}'s normal range (smallest normal number "
        f"2^{fi.minexp} = {float(fi.tiny):.3g}): below it the subnormal numbers keep an entry to "
        f"{float(fi.smallest_subnormal):.3g} absolute only, few digits or none",
        f"a product whose entries are all below 2^{e} ({actual})", fix))


def split_power(p: int) -> tuple[int, int]:
    """``(pa, pb)`` with ``pa + pb = p``: scalings of the two operands by ``2^pa`` and ``2^pb``, each within
    float64's range where ``p`` itself is not (data near ``2^-600`` need ``2^1712``)."""
    return p // 2, p - p // 2
