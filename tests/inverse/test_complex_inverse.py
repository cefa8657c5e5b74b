"""Complex ``inv`` (issue 28) against LAPACK's inverse in the same precision, on every route and scheduler.

Every route takes complex64 and complex128: the one in-core leaf (``getrf``/``getri`` of ``A^T``), the
out-of-core LU with partial pivoting (the rows of ``A^-1`` as ``A^-T e_i``: plain transposes, no
conjugation), and the randomized Schur recursion (a real orthogonal butterfly, complex leaves and GEMMs,
complex residuals ``I - A X`` in the Newton-Schulz refinement and the probes).

The reference is SciPy's ``inv`` (LAPACK's ``xgetri`` in the input's precision): ``numpy.linalg.inv``
inverts complex64 in complex128 and rounds (as it does float32), which no complex64 computation matches.

Bounds: the real norm-wise bounds of :mod:`support.tolerances` with ``eps`` of the parts' dtype, times
:data:`COMPLEX` = ``3 sqrt(2)`` (Higham 2002, Lemma 3.5 and §3.6). The backward error of an LU-based
inverse, ``||I - A X||_F <= c n eps ||A||_F ||X||_F`` (Higham Thm 14.3 with the growth factor of a
random matrix, and forming the residual, ``gamma_n``), ``c = 4``; the forward error then is at most
``8 n eps cond(A)`` relative for two such inverses (Thm 7.2). The issue's goal, a backward error within
10x LAPACK's, is checked too.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sl

import blocklin as bl
from blocklin.errors import ParameterError, SingularMatrixError
from support.tolerances import eps

CDTYPES = [np.complex64, np.complex128]
COMPLEX = 3 * np.sqrt(2)
SCHEDULERS = ["sync", "threads", "processes"]
#: Budgets that take each route at n = 150: the whole matrix in one leaf, the out-of-core LU
#: (panels of the 150 rows), and the Schur recursion with leaves below n.
ROUTES = {"direct": ("16MiB", "auto"), "lu": ("512KiB", "lu"), "schur": ("384KiB", "schur")}


def _crandn(rng, shape, dtype=np.complex128):
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)


def _general(n, dtype, seed=0, shift=1.0):
    """A random complex matrix (cond in the hundreds) with ``shift sqrt(n) I`` added (cond about 10 at 3)."""
    return (_crandn(np.random.default_rng(seed), (n, n)) + shift * np.sqrt(n) * np.eye(n)).astype(dtype)


def _eta(a, x):
    """``||I - A X||_F / (||A||_F ||X||_F)`` in complex128."""
    a64, x64 = a.astype(np.complex128), x.astype(np.complex128)
    return float(np.linalg.norm(np.eye(len(a)) - a64 @ x64) / (np.linalg.norm(a64) * np.linalg.norm(x64)))


def _check_inverse(a, x, dtype):
    """Backward error within the LU bound and 10x LAPACK's in the same precision; forward error
    within cond(A) times it."""
    n = a.shape[0]
    ref = sl.inv(a)
    eta, eta_lapack = _eta(a, x), _eta(a, ref)
    bound = 4 * COMPLEX * n * eps(dtype)
    assert eta <= bound, (eta, bound)
    assert eta <= 10 * eta_lapack, (eta, eta_lapack)
    a64 = a.astype(np.complex128)
    cond = np.linalg.cond(a64)
    ref64 = ref.astype(np.complex128)
    err = np.linalg.norm(x.astype(np.complex128) - ref64) / np.linalg.norm(ref64)
    assert err <= 8 * COMPLEX * n * eps(dtype) * cond, (err, cond)


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("route", list(ROUTES))
def test_every_route_against_lapack(dtype, route):
    n = 150
    a = _general(n, dtype, seed=3, shift=3.0 if route == "schur" else 1.0)
    memory, method = ROUTES[route]
    x = bl.inv(a, memory=memory, method=method, scheduler="sync")
    r = x.report
    assert x.dtype == np.dtype(dtype) and r["method"] == route
    if route == "schur":
        assert r["leaves"] >= 2 and r["gemm_steps"] >= 6  # out of core: the recursion ran
    _check_inverse(a, x.to_numpy(), dtype)
    # the reported backward error is that of the result (probed or exact: within the probes' spread)
    assert r["backward_error"] <= 3 * _eta(a, x.to_numpy()) + eps(dtype)


@pytest.mark.parametrize("route", [pytest.param("lu", marks=pytest.mark.slow), "schur"])
def test_schedulers_give_the_same_bits(route):
    n = 150
    a = _general(n, np.complex128, seed=5, shift=3.0)
    memory, method = ROUTES[route]
    xs = [bl.inv(a, memory=memory, method=method, scheduler=s).to_numpy() for s in SCHEDULERS]
    _check_inverse(a, xs[0], np.complex128)
    for other in xs[1:]:
        assert np.array_equal(xs[0], other)


@pytest.mark.parametrize("cond", [1e3, pytest.param(1e8, marks=pytest.mark.slow)])
def test_schur_refines_complex_residuals_to_the_unit_roundoff(cond):
    """An ill-conditioned complex128 matrix through the pivot-free recursion: the Newton-Schulz steps on
    the complex residual ``I - A X`` reach the default target ``eps / 2`` and LAPACK's accuracy or better."""
    rng = np.random.default_rng(7)
    n = 200
    u, _ = np.linalg.qr(_crandn(rng, (n, n)))
    v, _ = np.linalg.qr(_crandn(rng, (n, n)))
    a = (u * np.logspace(0, -np.log10(cond), n)) @ v.conj().T
    x = bl.inv(a, memory="512KiB", method="schur")
    r = x.report
    assert r["leaves"] >= 2 and r["refine_steps"] >= 1
    got = x.to_numpy()
    assert _eta(a, got) <= 2 * r["tol"] and _eta(a, got) <= 10 * _eta(a, sl.inv(a))
    ref = sl.inv(a)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) <= 8 * COMPLEX * n * eps(np.complex128) * cond


def test_lu_route_pivots_a_complex_permutation_like_matrix():
    """Zero leading blocks (a permutation times a complex diagonal): the LU route pivots, no refinement."""
    rng = np.random.default_rng(11)
    n = 160
    p = np.eye(n)[rng.permutation(n)]
    a = p * np.exp(2j * np.pi * rng.random(n))[None, :] + 1e-3 * _crandn(rng, (n, n))
    x = bl.inv(a, memory="512KiB", refine=False)
    assert x.report["method"] == "lu" and x.report["refine_steps"] == 0
    _check_inverse(a, x.to_numpy(), np.complex128)


def test_hermitian_and_real_data_keep_their_conventions():
    """The inverse of a Hermitian matrix is Hermitian to rounding; a real matrix stays real."""
    rng = np.random.default_rng(13)
    g = _crandn(rng, (120, 120))
    h = g @ g.conj().T + 120 * np.eye(120)
    x = bl.inv(h, memory="512KiB").to_numpy()
    _check_inverse(h, x, np.complex128)
    assert np.linalg.norm(x - x.conj().T) <= 4 * COMPLEX * 120 * eps(np.complex128) * np.linalg.norm(x)
    assert bl.inv(rng.standard_normal((20, 20))).dtype == np.float64


@pytest.mark.parametrize("precision", ["mixed", "tf32", "float32", "float64"])
def test_precision_refused_for_complex(precision):
    a = _general(20, np.complex128)
    with pytest.raises(ParameterError, match=r"precision: must be None for complex data.*complex128"):
        bl.inv(a, precision=precision)


def test_singular_complex_refused():
    rng = np.random.default_rng(17)
    a = _crandn(rng, (100, 100))
    a[:, 7] = 1j * a[:, 3]
    for memory in ("16MiB", "512KiB"):
        with pytest.raises(SingularMatrixError, match="nonsingular"):
            bl.inv(a, memory=memory)


def test_cli_inverts_a_complex_store(tmp_path, capsys):
    import json

    from blocklin.cli.main import main

    a = _general(60, np.complex64, seed=19, shift=3.0)
    bl.from_array(a, tmp_path / "a.zarr", chunks=(32, 32))
    rc = main(["inv", str(tmp_path / "a.zarr"), "-o", str(tmp_path / "x.zarr"), "--memory", "256KiB", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["dtype"] == "complex64"
    _check_inverse(a, bl.open(tmp_path / "x.zarr").to_numpy(), np.complex64)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", CDTYPES)
def test_gpu_complex_inverse(dtype):
    """The device path: the one-leaf inverse by cuSOLVER, and the recursion's butterfly passes, GEMM
    epilogues (``+ I``, ``|x|^2`` sums of the real and imaginary parts) and probes on the device."""
    a = _general(200, dtype, seed=23, shift=3.0)
    one = bl.inv(a, memory="64MiB", device="gpu")
    assert one.report["plan"]["direct"] and one.report["phases"]["leaf inverses"] == "gpu"
    _check_inverse(a, one.to_numpy(), dtype)
    rec = bl.inv(a, memory="512KiB", device="gpu", method="schur")
    assert rec.report["leaves"] >= 2
    _check_inverse(a, rec.to_numpy(), dtype)
