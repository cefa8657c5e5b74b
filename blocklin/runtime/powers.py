"""Powers of two: exact scalings of blocks, and the power of two a block's largest magnitude needs.

Data near the ends of a dtype's range (``1e200``, ``1e-200`` in float64) is divided by a power of two
before squares or products would overflow or underflow, and the result multiplied back: exact in
binary floating point (no rounding where the scaled value stays normal), so the scaled computation
has the unscaled one's relative error. The row passes scale strips as they read them, the block
kernels and the solvers their own blocks; all take the two functions from here.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def ldexp(x: np.ndarray, e: int, out: np.ndarray | None = None) -> np.ndarray:
    """``x * 2^e`` (exact where it fits), keeping a float or complex dtype (integers give float64, as
    ``numpy.ldexp`` gives them: never cast back, which would truncate); complex data by its real and
    imaginary parts (``numpy.ldexp`` takes real data only); in place with ``out=x``."""
    x = np.asarray(x)
    if x.dtype.kind != "c":
        if out is not None:
            return np.ldexp(x, e, out=out)
        y = np.ldexp(x, e)
        return y.astype(x.dtype, copy=False) if x.dtype.kind == "f" else y
    r = out if out is not None else np.empty_like(x)
    np.ldexp(x.real, e, out=r.real)
    np.ldexp(x.imag, e, out=r.imag)
    return r


def max_exponent(x: Any) -> int:
    """``e`` with ``max |x| = f 2^e``, ``f`` in ``[0.5, 1)``: the power of two of the largest magnitude in
    ``x`` (``0`` for zero, NaN, Inf or an empty ``x``), what dividing by ``2^e`` brings near 1 (exact)."""
    top = float(np.max(np.abs(x))) if np.size(x) else 0.0
    return int(np.frexp(top)[1]) if 0 < top < np.inf else 0

