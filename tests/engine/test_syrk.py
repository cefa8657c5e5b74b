"""The Gram sums' SYRK helper (:func:`blocklin.device.syrk.syrk_acc`) on every layout a strip comes in.

Strips of a tall source come by rows (C order); strips of a source streamed transposed (a wide ``A``'s
columns) by columns, contiguous or with a leading dimension above their rows; others need a copy.
Each is summed into a float64 (complex128) ``lower(G) += A^H A`` and checked against the product
bound of :func:`support.tolerances.assert_gram`, with the copy split into several blocks too.
"""

from __future__ import annotations

import numpy as np
import pytest

from blocklin.device import host_blas, syrk
from blocklin.device.syrk import symmetrize_lower, syrk_acc
from support.tolerances import assert_gram

DTYPES = [np.float64, np.float32, np.complex128, np.complex64]


def _strip(layout: str, dtype, rng) -> np.ndarray:
    h, n = 700, 37
    big = rng.standard_normal((n, 3 * h))
    if np.dtype(dtype).kind == "c":
        big = big + 1j * rng.standard_normal(big.shape)
    big = big.astype(dtype)
    return {"rows": np.ascontiguousarray(big[:, :h].T),        # C order
            "columns": np.asfortranarray(big[:, :h].T),        # Fortran order
            "columns with ld": big[:, h:2 * h].T,               # Fortran order, leading dimension 3h
            "every other row": big[:, ::3].T,                   # no BLAS layout: copied
            }[layout]


@pytest.mark.parametrize("layout", ["rows", "columns", "columns with ld", "every other row"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_bytes", [None, 4096], ids=["one block", "blocks"])
def test_syrk_acc_sums_every_layout(layout, dtype, block_bytes, monkeypatch):
    if block_bytes is not None:
        monkeypatch.setattr(syrk, "SYRK_CAST_BLOCK_BYTES", block_bytes)
    rng = np.random.default_rng(3)
    a = _strip(layout, dtype, rng)
    acc = np.complex128 if np.dtype(dtype).kind == "c" else np.float64
    g = np.zeros((a.shape[1], a.shape[1]), acc)
    syrk_acc(g, a)
    syrk_acc(g, a[:50])  # a second strip added to the first
    g = symmetrize_lower(g)
    x = np.asarray(a, acc)
    both = np.vstack([x, x[:50]])
    # the products of the sum's dtype: float32 and complex64 strips are cast exactly, then summed in float64
    assert_gram(g, both.conj().T @ both, both, dtype=acc)
    if acc is np.complex128:
        assert np.all(g.diagonal().imag == 0)


@pytest.mark.parametrize("layout", ["columns", "columns with ld"])
def test_real_strips_by_columns_are_summed_as_they_lie(layout, monkeypatch):
    """A float64 strip stored by columns goes to SYRK itself (its transposed form), not a copy."""
    calls = []
    real = host_blas.syrk

    def spy(alpha, a, **kw):
        calls.append((a, kw["trans"]))
        return real(alpha, a, **kw)

    monkeypatch.setattr(host_blas, "syrk", spy)
    a = _strip(layout, np.float64, np.random.default_rng(4))
    syrk_acc(np.zeros((a.shape[1], a.shape[1])), a)
    assert len(calls) == 1 and calls[0][0] is a and calls[0][1] == 1
