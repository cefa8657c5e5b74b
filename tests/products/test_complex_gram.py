"""blocklin.gram of complex data: ``A^H A`` (``A A^H`` with ``trans``) by HERK, against NumPy.

NumPy users write ``a.conj().T @ a``; BLAS's ``zherk``/``cherk`` compute it on one triangle and
return it Hermitian with an exactly real diagonal, which blocklin writes full. Ported cases: Dask's
``array/tests/test_linalg.py`` complex inputs (``x.conj().T @ x`` of chunked random complex data,
as ``test_cholesky_complex`` builds its Hermitian matrix) and NumPy's ``matmul`` tests of the
conjugate-transposed product (``test_multiarray.TestMatmul`` complex dtypes).

Tolerances: :func:`support.tolerances.assert_gram` (``||G - A^H A||_F <= c k eps ||A||_F^2``) with
``eps`` of the parts' dtype times ``3 sqrt(2)``: a complex inner product of length k carries
``sqrt(2) gamma_{k+2}`` in place of ``gamma_k`` (Higham 2002, Lemma 3.5 and §3.6).
"""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import DTypeError
from support.tolerances import assert_gram, assert_product

CDTYPES = [np.complex64, np.complex128]
#: The complex-arithmetic factor on the real rounding-error bounds (see the module docstring).
COMPLEX = 3 * np.sqrt(2)


@pytest.fixture(scope="module")
def c128():
    rng = np.random.default_rng(28)
    return rng.standard_normal((300, 70)) + 1j * rng.standard_normal((300, 70))


def _reference(a: np.ndarray, trans: bool) -> np.ndarray:
    a = a.astype(np.complex128)
    return a @ a.conj().T if trans else a.conj().T @ a


def _hermitian(g: np.ndarray) -> None:
    assert np.array_equal(g, g.conj().T)  # written full and exactly Hermitian
    assert not np.diagonal(g).imag.any()  # HERK's convention: the diagonal is real


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("memory,route", [("32MiB", "pass"), ("96KiB", "tiles")])
def test_complex_gram_matches_numpy(tmp_path, c128, dtype, trans, memory, route):
    x = c128.astype(dtype)
    a = bl.from_array(x, tmp_path / "a.zarr", chunks=(64, 32))
    g = bl.gram(a.path, tmp_path / "g.zarr", trans=trans, memory=memory, scheduler="sync")
    got = g.to_numpy()
    assert g.report["route"] == route and got.dtype == dtype and got.shape == ((300, 300) if trans else (70, 70))
    assert_gram(got, _reference(x, trans), x, trans=trans, const=2 * COMPLEX)
    _hermitian(got)


def test_complex_gram_can_fail(tmp_path, c128):
    # the bound tells A^H A from A^T A (the transpose without the conjugate) by orders of magnitude
    g = bl.gram(c128, memory="32MiB").to_numpy()
    with pytest.raises(AssertionError, match="exceeds the bound"):
        assert_gram(g, c128.T @ c128, c128, const=2 * COMPLEX)


@pytest.mark.parametrize("memory", ["32MiB", "96KiB"])
@pytest.mark.parametrize("trans", [False, True])
def test_complex_gram_identical_bits_on_every_scheduler(tmp_path, c128, memory, trans):
    a = bl.from_array(c128[:200, :40], tmp_path / "a.zarr", chunks=(64, 16))
    runs = [bl.gram(a.path, trans=trans, memory=memory, scheduler=s, workers=2).to_numpy()
            for s in ("sync", "threads", "processes")]
    assert all(np.array_equal(runs[0], r) for r in runs[1:])


def test_complex_gram_scales_entries_near_the_range_ends(c128):
    # entries of 2^+-300 (outside the range squared safely): the pass scales A by a power of two as
    # it reads it, the real and imaginary parts alike, and the result back (exact)
    x = c128[:100, :20]
    for e in (300, -300):
        g = bl.gram(x * 2.0 ** e, memory="32MiB", scale=2.0 ** (-2 * e))
        assert_gram(g.to_numpy(), _reference(x, False), x, const=2 * COMPLEX)
        assert np.sign(g.report["scaling"]["exponent"]) == np.sign(e)


@pytest.mark.parametrize("trans", [False, True])
def test_complex_gram_beyond_the_range_names_the_conjugate_transpose(c128, trans):
    """The refusal of a complex Gram beyond the range names ``scale * A^H A`` (``A A^H``), what ``gram``
    computes for complex data; it had said ``A^T A``."""
    from blocklin.errors import ParameterError

    name = "A A\\^H" if trans else "A\\^H A"
    with pytest.raises(ParameterError, match=rf"returns scale \* {name} \(exact\)"):
        bl.gram(c128 * 1e200, trans=trans)


def test_complex_gram_refuses_a_real_dtype_and_matmul_keeps_the_plain_transpose(tmp_path, c128):
    with pytest.raises(DTypeError, match="complex operand cannot be cast to a real dtype"):
        bl.gram(c128, dtype="float64")
    # matmul(x, x, trans_a=True) is X^T X (no conjugate, as NumPy's x.T @ x): not the Gram route
    a = bl.from_array(c128, tmp_path / "a.zarr")
    c = bl.matmul(a.path, a.path, trans_a=True, memory="32MiB")
    assert c.report.get("route") != "gram"
    assert_gram(c.to_numpy(), c128.T @ c128, c128, const=2 * COMPLEX)


@pytest.mark.gpu
@pytest.mark.parametrize("trans,memory", [(False, "8MiB"), (True, "8MiB"), (False, "96KiB")])
def test_complex_gram_on_gpu(tmp_path, c128, trans, memory):
    x = c128[:200, :50]
    g = bl.gram(x, trans=trans, memory=memory, device="gpu", device_memory="64MiB")
    assert g.report["device"] == "gpu"
    got = g.to_numpy()
    assert_gram(got, _reference(x, trans), x, trans=trans, const=2 * COMPLEX)
    _hermitian(got)


@pytest.mark.parametrize("alpha,beta", [(1j, 0.0), (np.complex64(2 + 0j), 0.0), (1.0, 1j)])
def test_complex_alpha_beta_refused_as_complex(alpha, beta):
    """A complex ``alpha`` or ``beta`` is refused saying it must be real, with the way to get the product; the
    refusal had said "must be a finite number; got 1j" (1j is one)."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((6, 4)) + 1j * rng.standard_normal((6, 4))
    c = np.zeros((6, 6), dtype=complex)
    name = "alpha" if isinstance(alpha, (complex, np.complexfloating)) else "beta"
    with pytest.raises(bl.errors.ParameterError, match=rf"^{name}: must be a real number.*1j \* b"):
        bl.matmul(a, a.conj().T, c=c, alpha=alpha, beta=beta, scheduler="sync")
    # the product it names: the complex factor folded into an operand
    b = 1j * a.conj().T
    got = bl.matmul(a, b, scheduler="sync").to_numpy()
    assert_product(got, a @ b, a, b, const=2 * 3 * np.sqrt(2))  # complex products: 3 sqrt(2) (Higham Lemma 3.5)
