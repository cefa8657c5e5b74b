"""The Krylov bases of block Lanczos (:mod:`blocklin.linalg.lowrank.basis`): the spilled basis gives the
bits of the one in memory (the same strips, the same sums), strip by strip; its file closes and goes."""

from __future__ import annotations

import os

import numpy as np
import pytest
import scipy.sparse as sp

import blocklin.linalg.lowrank.basis as basis_mod
from blocklin.linalg.lowrank.basis import MemoryBasis, SpilledBasis, ritz_residuals, strip_bounds
from blocklin.linalg.lowrank.lanczos import block_lanczos


@pytest.fixture
def small_strips(monkeypatch):
    monkeypatch.setattr(basis_mod, "STRIP_BYTES", 1 << 13)  # several strips of a few hundred rows


def _pair(folder, n, cap, dtype, name="b"):
    folder.mkdir(exist_ok=True)
    return MemoryBasis(n, cap, dtype), SpilledBasis(n, cap, dtype, str(folder / f"{name}.bin"))


def _threaded(n, cap, dtype, threads=3):
    """A basis in memory whose strips run on ``threads`` threads (:meth:`Basis.map_strips`)."""
    b = MemoryBasis(n, cap, dtype)
    b.threads = threads
    return b


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_basis_operations_agree_bit_for_bit_and_with_numpy(tmp_path, small_strips, dtype):
    n, cap = 1003, 12
    rng = np.random.default_rng(0)

    def rand(*shape):
        x = rng.standard_normal(shape)
        return (x + 1j * rng.standard_normal(shape)).astype(dtype) if np.dtype(dtype).kind == "c" else x

    assert len(strip_bounds(n, cap, np.dtype(dtype).itemsize)) >= 5
    x1, x2, z, c, y = rand(n, 5), rand(n, 4), rand(n, 3), rand(9, 3), rand(9, 6)
    ref = np.hstack([x1, x2])
    got = []
    for b in (*_pair(tmp_path / "spill", n, cap, dtype), _threaded(n, cap, dtype)):
        b.append(x1)
        b.append(x2)
        assert b.shape == (n, 9) and np.array_equal(b.to_numpy(), ref)
        d = b.dot(z)
        s = b.subtract(z.copy(), c)
        fused, after, gram = b.subtract_dot(z.copy(), c)
        assert np.array_equal(fused, s)  # subtract's bits, and the dot of its result in the same read
        assert np.array_equal(after, b.dot(fused))
        alone, gram_alone = b.subtract_gram(z.copy(), c)
        assert np.array_equal(alone, s) and np.array_equal(gram_alone, gram)
        t = b.times(y)
        g = b.gram()
        b.restart(y[:, :4])
        got.append((d, s, gram, t, g, b.to_numpy()))
        b.close()
    for other in got[1:]:  # spilled, and in memory on three threads: the bits of one thread in memory
        for a, o in zip(got[0], other):
            assert np.array_equal(a, o)
    d, s, gram, t, g, r = got[0]
    tol = 64 * n * np.finfo(np.float64).eps
    assert np.linalg.norm(gram - s.conj().T @ s) <= tol * np.linalg.norm(s) ** 2
    assert np.linalg.norm(g - ref.conj().T @ ref) <= tol * np.linalg.norm(ref) ** 2
    tol = 64 * n * np.finfo(np.float64).eps
    assert np.linalg.norm(d - ref.conj().T @ z) <= tol * np.linalg.norm(ref) * np.linalg.norm(z)
    assert np.linalg.norm(s - (z - ref @ c)) <= tol * np.linalg.norm(ref) * np.linalg.norm(c) * 4
    assert np.linalg.norm(t - ref @ y) <= tol * np.linalg.norm(ref) * np.linalg.norm(y)
    # the restart is the product with the first 4 columns: a GEMM of another width, whose bits BLAS
    # need not share with the 6-column one (OpenBLAS's complex Haswell kernels do not), so a bound
    assert np.linalg.norm(r - ref @ y[:, :4]) <= tol * np.linalg.norm(ref) * np.linalg.norm(y[:, :4])
    assert not os.listdir(tmp_path / "spill")  # the spilled file went with close()


def test_ritz_residuals_of_both_bases(tmp_path, small_strips):
    n, cap = 700, 8
    rng = np.random.default_rng(1)
    v, w, y, theta = rng.standard_normal((n, 6)), rng.standard_normal((n, 6)), rng.standard_normal((6, 3)), rng.random(3)
    norms = []
    (mv, sv), (mw, sw) = _pair(tmp_path / "spill", n, cap, np.float64, "V"), _pair(tmp_path / "spill", n, cap,
                                                                                    np.float64, "W")
    # in memory; spilled; in memory on three threads; one of each (then read in turn)
    for (V, W) in ((mv, mw), (sv, sw), (_threaded(n, cap, np.float64), _threaded(n, cap, np.float64)),
                   (_threaded(n, cap, np.float64), SpilledBasis(n, cap, np.float64, str(tmp_path / "spill/w2.bin")))):
        V.append(v)
        W.append(w)
        norms.append(ritz_residuals(V, W, y, theta)[0])
        V.close()
        W.close()
    for other in norms[1:]:
        assert np.array_equal(norms[0], other)
    ref = np.linalg.norm(w @ y - (v @ y) * theta, axis=0)
    assert np.allclose(norms[0], ref, rtol=1e-13, atol=0)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_block_lanczos_spilled_has_the_in_memory_bits(tmp_path, small_strips, dtype):
    """Thick restarts, the residual check and the returned pairs: spilled, the same bits as in memory."""
    n = 900
    a = sp.random(n, n, density=0.01, random_state=2, format="csr")
    if np.dtype(dtype).kind == "c":
        a = a + 1j * sp.random(n, n, density=0.01, random_state=3, format="csr")
    a = (a + a.conj().T).tocsr() + sp.diags(np.r_[np.zeros(n - 4), [30.0, 40.0, 50.0, 60.0]])

    def apply(x, step):
        return np.asarray(a @ x)

    def spill(n_, cap, dt):
        return (SpilledBasis(n_, cap, dt, str(tmp_path / "V.bin")), SpilledBasis(n_, cap, dt, str(tmp_path / "W.bin")))

    kw = dict(which="LA", block=3, max_basis=12, max_steps=300, seed=0, dtype=dtype,
              threshold=lambda t: np.full(t.shape, 1e-9 * float(np.abs(t).max())))
    mem = block_lanczos(apply, n, 4, **kw)
    spilled = block_lanczos(apply, n, 4, bases=spill, **kw)
    assert mem.converged and mem.restarts >= 1
    assert (mem.steps, mem.restarts) == (spilled.steps, spilled.restarts)
    assert np.array_equal(mem.values, spilled.values) and np.array_equal(mem.residuals, spilled.residuals)
    assert np.array_equal(mem.vectors, spilled.vectors.to_numpy())
    assert np.array_equal(mem.residual_vectors, spilled.residual_vectors.to_numpy())
    ref = np.linalg.eigvalsh(a.toarray())[::-1][:4]
    assert np.allclose(np.sort(mem.values)[::-1], ref, rtol=0, atol=1e-8 * 60)


def test_a_basis_says_where_its_strips_live():
    """``Basis`` is abstract: only its in-memory and spilled kinds, which say where a strip's columns live,
    can be made."""
    from blocklin.linalg.lowrank.basis import Basis, MemoryBasis

    with pytest.raises(TypeError):
        Basis(10, 2, np.float64)
    assert MemoryBasis(10, 2, np.float64).shape == (10, 0)
