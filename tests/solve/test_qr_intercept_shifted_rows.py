"""``method="qr"`` with ``fit_intercept`` on tall data whose column means dwarf their spread: the TSQR of
``[1 | A - 1 a_1^T | b - b_1]`` (the rows less the first row) against the exact minimizer (mpmath, the
block normal equations of ``[1 | A]`` at 80 digits on the data as stored).

Bound (Higham 2002, Thm 20.3, the least-squares perturbation theorem for Householder QR of the stacked
``[A_c; lam I]``): ``c m n eps (kappa + kappa^2 ||r|| / (||A_c|| ||x||)) g ||x||``, ``kappa`` the regularized
problem's condition number, ``g = max_j sqrt(1 + d_j^2 / var_j)`` the growth of the columns the Householder
step factors over the centered ones (``d`` the means of the shifted rows, of the size of the spread);
the intercept ``bbar - mu^T x`` adds ``|mu|^T |x|`` times that and the rounding of its sum. Streaming
``[1 | A | b]`` itself had ``g = |mu| / sd``: means ``1e8`` gave ``x`` ``7e-9`` relative off and the intercept
``2.6`` off for ``-5.1e8`` (scikit-learn's ``Ridge``, which centers before it solves: ``4e-7``)."""

from __future__ import annotations

import mpmath as mp
import numpy as np
import pytest

import blocklin as bl
from support.placements import SCHEDULERS, scheduler_arg
from support.tolerances import eps

EPS64 = eps(np.float64)


def _exact(a, b, lam):
    """``(x, x0)`` of ``min ||A x + 1 x0 - b||^2 + lam^2 ||x||^2`` from ``[1 | A]``'s normal equations in mpmath
    (80 digits: exact data, no centering)."""
    m, n = a.shape
    with mp.workdps(80):
        c = mp.matrix([[1] + [mp.mpf(float(v)) for v in row] for row in a])
        k = c.T * c
        for i in range(1, n + 1):
            k[i, i] += mp.mpf(float(lam)) ** 2
        z = mp.lu_solve(k, c.T * mp.matrix([mp.mpf(float(v)) for v in b[:, 0]]))
    z = np.array([float(v) for v in z])
    return z[1:, None], z[0]


def _data(m, n, mean, dtype, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, n)) + mean * (1 + rng.random(n))
    b = (a - a.mean(0)) @ rng.standard_normal((n, 1)) + 0.1 * rng.standard_normal((m, 1)) + 3.0
    return a.astype(dtype), b.astype(dtype)


@pytest.mark.parametrize("dtype,mean", [(np.float64, 1e8), (np.float32, 1e4)])
@pytest.mark.parametrize("memory", [None, "64KiB"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_qr_intercept_of_large_means(dtype, mean, memory, device):
    """On the GPU the shift of the strip had run on CuPy's legacy stream, unordered with the upload that
    made the strip and the QR that read it (the stand-in's ordering check; its intercept came out twice
    the right one, as the unshifted strip was factored and the shift then added back)."""
    a, b = _data(60, 4, mean, dtype)
    lam = 0.5
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    x_ref, x0_ref = _exact(a64, b64, lam)
    x = bl.solve(a, b, lam=lam, method="qr", fit_intercept=True, device=device,
                 **({"memory": memory} if memory else {}))
    assert x.report["method"] == "qr" and x.report["device"] == device
    ac, bc = a64 - a64.mean(0), b64 - b64.mean(0)
    s = np.linalg.svd(ac, compute_uv=False)
    kappa = np.sqrt((s[0] ** 2 + lam ** 2) / (s[-1] ** 2 + lam ** 2))
    xn, r = float(np.linalg.norm(x_ref)), float(np.linalg.norm(bc - ac @ x_ref))
    d = (a64 - a64[0]).mean(0)
    g = float(np.max(np.sqrt(1 + d ** 2 / ac.var(0))))
    m, n = a.shape
    xb = 16 * m * n * EPS64 * (kappa + kappa ** 2 * r / (s[0] * xn)) * g * xn
    got = np.asarray(x.to_numpy(), np.float64)
    assert np.linalg.norm(got - x_ref) <= xb + 2 * eps(dtype) * xn, (np.linalg.norm(got - x_ref), xb)
    mu = a64.mean(0)
    # the intercept is formed in float64 from the float64 x, before x is rounded to the output dtype
    ib = np.abs(mu) @ np.abs(x_ref).ravel() * (xb / xn) + 4 * (n + 2) * EPS64 * (np.abs(mu) @ np.abs(x_ref).ravel()
                                                                                  + abs(x0_ref))
    err = abs(float(np.ravel(x.intercept)[0]) - x0_ref)
    assert err <= ib, (err, ib, x0_ref)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_qr_intercept_has_the_same_bits_on_every_scheduler(scheduler, request):
    """The shifted rows' factors of the tasks are reduced in row order: the sync run's ``x`` and intercept
    on every scheduler, for a ``workers=`` setting too (a LocalCluster of one task thread per worker had
    planned the strips of one task, twice the setting's, and their QR differed in the last bits)."""
    a, b = _data(600, 4, 1e8, np.float64)
    kw = {"lam": 0.5, "method": "qr", "fit_intercept": True, "memory": "64KiB", "workers": 2}
    ref = bl.solve(a, b, scheduler="sync", **kw)
    x = bl.solve(a, b, scheduler=scheduler_arg(scheduler, request), **kw)
    assert x.report["method"] == "qr"
    np.testing.assert_array_equal(x.to_numpy(), ref.to_numpy())
    np.testing.assert_array_equal(np.ravel(x.intercept), np.ravel(ref.intercept))
