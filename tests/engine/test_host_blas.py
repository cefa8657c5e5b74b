"""The host BLAS calls without the GIL (blocklin.device.host_blas): SciPy's bits, and the GIL released."""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest
from scipy.linalg import blas

from blocklin.device import host_blas

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
P = {np.float32: "s", np.float64: "d", np.complex64: "c", np.complex128: "z"}


def _rand(rng, shape, dt, order="F"):
    x = rng.standard_normal(shape)
    if np.dtype(dt).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return np.asarray(x.astype(dt), order=order)


def _strided(rng, shape, dt, pad=5):
    """A Fortran-ordered view with a leading dimension larger than its rows (a block of a taller array)."""
    big = _rand(rng, (shape[0] + pad, shape[1]), dt)
    return big[2:2 + shape[0]]


def test_the_wheels_library_is_found():
    # the test extra installs SciPy's wheels, which bundle the OpenBLAS this module calls
    assert host_blas.library() is not None, "SciPy's bundled OpenBLAS was not found or failed the probe"


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "leading-dim"])
def test_gemm_gives_scipys_bits(dt, ta, tb, strided):
    rng = np.random.default_rng([ta, tb, strided, DTYPES.index(dt)])
    m, n, k = 67, 29, 131
    make = _strided if strided else _rand
    a = make(rng, (k, m) if ta else (m, k), dt)
    b = make(rng, (n, k) if tb else (k, n), dt)
    c = make(rng, (m, n), dt)
    want = getattr(blas, f"{P[dt]}gemm")(0.5, a, b, beta=1.0, c=np.array(c, order="F"), trans_a=ta, trans_b=tb)
    got = c.copy() if not strided else c  # a strided c is updated in place
    host_blas.gemm(0.5, a, b, beta=1.0, c=got, trans_a=ta, trans_b=tb)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("trans", [0, 1])
@pytest.mark.parametrize("lower", [0, 1])
def test_syrk_gives_scipys_bits(dt, trans, lower):
    rng = np.random.default_rng([trans, lower, DTYPES.index(dt)])
    n, k = 45, 300
    a = _rand(rng, (k, n) if trans else (n, k), dt)
    c = _rand(rng, (n, n), dt)
    if np.dtype(dt).kind == "c":
        want = getattr(blas, f"{P[dt]}herk")(1.0, a, beta=1.0, c=c.copy(order="F"), trans=2 if trans else 0, lower=lower)
    else:
        want = getattr(blas, f"{P[dt]}syrk")(1.0, a, beta=1.0, c=c.copy(order="F"), trans=trans, lower=lower)
    got = c.copy(order="F")
    host_blas.syrk(1.0, a, beta=1.0, c=got, trans=trans, lower=lower)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("side,lower,ta,diag", [(0, 0, 0, 0), (0, 1, 1, 0), (1, 1, 0, 1), (1, 0, 1, 0)])
def test_trsm_gives_scipys_bits(dt, side, lower, ta, diag):
    rng = np.random.default_rng([side, lower, ta, diag, DTYPES.index(dt)])
    t = np.asfortranarray(_rand(rng, (40, 40), dt) + 10 * np.eye(40, dtype=dt))
    b = _rand(rng, (40, 17) if side == 0 else (17, 40), dt)
    want = getattr(blas, f"{P[dt]}trsm")(2.0, t, b.copy(order="F"), side=side, lower=lower, trans_a=ta, diag=diag)
    got = b.copy(order="F")
    out = host_blas.trsm(2.0, t, got, side=side, lower=lower, trans_a=ta, diag=diag)
    assert out is got and np.array_equal(got, want)


def test_operands_outside_blas_layout_go_through_scipy():
    rng = np.random.default_rng(3)
    a = _rand(rng, (50, 20), np.float64, order="C")  # C-ordered, not a transposed view: the wrapper copies it
    b = _rand(rng, (20, 30), np.float64)
    c = np.zeros((50, 30), order="C")  # C-ordered output: the wrapper works on a copy, copied back
    host_blas.gemm(1.0, a, b, beta=0.0, c=c)
    np.testing.assert_array_equal(c, blas.dgemm(1.0, a, b))
    a32 = a.astype(np.float32)  # another dtype than c: the wrapper casts
    host_blas.gemm(1.0, a32, b, beta=0.0, c=np.asfortranarray(c))
    assert not host_blas.blas_layout(np.zeros((3, 4))) and host_blas.blas_layout(np.zeros((3, 4)).T)
    assert host_blas.blas_layout(np.zeros((8, 4), order="F")[1:5])  # a leading dimension above its rows


def test_a_call_lets_other_threads_run():
    """While one thread is inside a long GEMM, another runs Python code (a held GIL would stop it).

    The switch interval is raised to 10 s, so the GIL changes hands only where a thread gives it up:
    the waiting loop at each ``time.sleep(0)``, the GEMM's thread only inside a call that releases it."""
    import time

    n = 2000
    rng = np.random.default_rng(5)
    a, b = _rand(rng, (n, n), np.float64), _rand(rng, (n, n), np.float64)
    c = np.zeros((n, n), order="F")
    inside, done = threading.Event(), threading.Event()

    def work():
        inside.set()
        host_blas.gemm(1.0, a, b, beta=1.0, c=c)  # 16 GFLOP: a tenth of a second or more on one thread
        done.set()

    from blocklin._blas import blas_threads

    interval = sys.getswitchinterval()
    sys.setswitchinterval(10.0)
    try:
        with blas_threads(1):
            th = threading.Thread(target=work)
            th.start()
            inside.wait()
            count = 0
            while not done.is_set():
                count += 1
                time.sleep(0)  # gives the GIL up: the GEMM's thread takes it back when its call returns
            th.join()
    finally:
        sys.setswitchinterval(interval)
    # held through the call, the GIL would reach this thread only once the GEMM was done: no iteration
    assert count > 100, count
    np.testing.assert_allclose(c, a @ b, rtol=0, atol=n * 4 * np.finfo(np.float64).eps * np.abs(a).max() * np.abs(b).max())


def test_the_scipy_setting_keeps_the_wrappers():
    code = ("from blocklin.device import host_blas; import numpy as np; "
            "c = np.zeros((2, 2), order='F'); host_blas.gemm(1.0, np.eye(2, order='F'), np.eye(2, order='F'), beta=0.0, c=c); "
            "print(host_blas.library() is None, c.tolist())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, host_blas.ENV: "scipy"}).stdout.split(None, 1)
    assert out[0] == "True" and out[1].strip() == "[[1.0, 0.0], [0.0, 1.0]]"


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("shape", [(300, 40), (40, 300), (1, 7), (9, 9)])
def test_qr_r_gives_scipys_bits(dt, shape):
    from scipy.linalg import qr

    rng = np.random.default_rng([shape[0], shape[1], DTYPES.index(dt)])
    x = _rand(rng, shape, dt, order="C")
    kept = x.copy()
    (want,) = qr(x.copy(), mode="r")
    got = host_blas.qr_r(x)
    assert np.array_equal(got, want[: min(shape)]) and np.array_equal(x, kept)  # x itself untouched


@pytest.mark.parametrize("probe", ["differs", "raises"])
def test_a_failed_probe_keeps_scipys_wrappers(monkeypatch, probe):
    def fake(lib):
        if probe == "raises":
            raise OSError("probe")
        return False

    monkeypatch.setattr(host_blas, "_STATE", {})
    monkeypatch.setattr(host_blas, "_probe", fake)
    assert host_blas.library() is None
    rng = np.random.default_rng(8)
    a, b = _rand(rng, (30, 20), np.float64), _rand(rng, (20, 10), np.float64)
    c = np.zeros((30, 10), order="F")
    host_blas.gemm(1.0, a, b, beta=0.0, c=c)
    np.testing.assert_array_equal(c, blas.dgemm(1.0, a, b))
    np.testing.assert_array_equal(host_blas.qr_r(a), np.triu(__import__("scipy.linalg").linalg.qr(a, mode="r")[0][:20]))


def test_a_read_only_output_is_never_written_through():
    rng = np.random.default_rng(9)
    a, b = _rand(rng, (8, 6), np.float64), _rand(rng, (6, 5), np.float64)
    c = np.zeros((8, 5), order="F")
    c.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        host_blas.gemm(1.0, a, b, beta=0.0, c=c)
    assert not c.any()
