"""Triplets far below ``s_1`` of a stored ``A``: their residuals measured from ``A^T u`` by one more pass.

The methods measure ``||A^T u - s v||`` through ``Z = A^T A Q`` (the last pass's product), rounded at
``eps sqrt(M) s_1^2``: a triplet at ``s`` carries ``eps sqrt(M) s_1^2 / s`` (Golub and Van Loan, Matrix
Computations, 4th ed., Sec. 8.6), so accurate triplets of a graded stored matrix read as unconverged,
with a warning. Where such a triplet misses ``tol`` on that measure, one more pass over ``A`` forms
``A^T u`` directly (rounded at ``eps sqrt(M) s_1``), counted in ``report["passes"]``; data whose
triplets converge keeps its passes.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import ConvergenceWarning
from blocklin.linalg.lowrank.svd_tolerance import default_tol
from support.tolerances import assert_singular_values

M, N, K = 3000, 40, 30
EPS = float(np.finfo(np.float64).eps)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """``s`` from 1 to ``1e-12`` (logarithmically), random singular vectors, stored."""
    rng = np.random.default_rng(1)
    q1, _ = np.linalg.qr(rng.standard_normal((M, N)))
    q2, _ = np.linalg.qr(rng.standard_normal((N, N)))
    a = (q1 * np.logspace(0, -12, N)) @ q2.T
    path = tmp_path_factory.mktemp("graded") / "a.zarr"
    bl.from_array(a, path)
    return a, path


def _svd(path, **kw):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        res = bl.svd(path, K, seed=0, memory="1MiB", **kw)
    return res, [w for w in seen if issubclass(w.category, ConvergenceWarning)]


@pytest.mark.parametrize("method", ["rsvd", "lanczos"])
def test_accurate_triplets_far_below_s1_read_as_converged(graded, method):
    """Before: relative residuals of 1e-4 to 0.8 reported for triplets whose own are about 1e-9, the run
    ``converged=False`` with a ``ConvergenceWarning``. Now the triplets that missed ``tol`` are measured
    from ``A^T u`` by one more pass (in ``passes`` and its formula), and the run converges.

    The triplets are checked against LAPACK: each value within Weyl's ``4 M eps s_1``
    (:func:`assert_singular_values`), and the residual recomputed here at most the reported one plus the
    rounding of forming ``A^T u - s v`` (``M eps s_1``, the sum over ``M`` rows of ``|a_ij| |u_i| <= s_1``,
    twice: the run's and this test's), within ``tol`` of its scale as ``converged`` says."""
    a, path = graded
    res, warned = _svd(path, method=method)
    rep = res.report
    assert not rep["in_core"]
    assert not warned and rep["converged"] is True
    assert rep["remeasured"] >= 1 and rep["passes_formula"].endswith("+ 1 (residuals measured from A^T u)")
    full = np.linalg.svd(a, compute_uv=False)
    assert_singular_values(res.s, full[:K], n=M)
    u, vt = res.U.to_numpy(), np.asarray(res.Vt)
    own = np.linalg.norm(a.T @ u - vt.T * res.s, axis=0)
    assert np.all(own <= np.asarray(rep["residuals"]) + 2 * M * EPS * full[0])  # never optimistic
    # and within tol of their own scale, as converged says
    scale = np.maximum(res.s, np.sqrt(EPS) * res.s[0])
    assert np.all(own <= default_tol(np.float64) * scale + 2 * M * EPS * full[0])


def test_one_more_pass_only_where_a_triplet_misses_tol(graded, tmp_path):
    """Data whose triplets converge on the first measure (the leading 10 of the graded matrix; a random
    matrix) takes no extra pass: ``remeasured`` is absent and the passes are the formula's."""
    _, path = graded
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        res = bl.svd(path, 10, method="lanczos", seed=0, memory="1MiB")
        assert "remeasured" not in res.report and "+ 1 (residuals" not in res.report["passes_formula"]
        b = tmp_path / "b.zarr"
        bl.from_array(np.random.default_rng(2).standard_normal((M, N)), b)
        res = bl.svd(b, K, method="rsvd", seed=0, memory="1MiB")
        assert "remeasured" not in res.report and res.report["converged"] is True


def test_the_extra_pass_runs_on_the_gpu(graded, standin):
    """``device="gpu"`` (the CuPy stand-in): the extra pass's ``A^T u`` goes through the device's products
    as every pass does, with the CPU's verdict and singular values (Weyl, :func:`assert_singular_values`)."""
    from support import cupy_standin

    a, path = graded
    res, warned = _svd(path, method="lanczos", device="gpu")
    assert res.report["phases"] == {"passes over A": "gpu"}
    assert not warned and res.report["converged"] is True and res.report["remeasured"] >= 1
    assert_singular_values(res.s, np.linalg.svd(a, compute_uv=False)[:K], n=M)
    assert cupy_standin.take_races() == []


def test_the_gram_route_too(tmp_path):
    """``method="gram"`` (a block short of ``N``: its Rayleigh-Ritz step, then Lanczos): a graded
    ``3000 x 80`` matrix (``s`` from 1 to ``1e-12``), ``k = 50``, had ended unconverged with a warning;
    its values are LAPACK's within Weyl's ``4 M eps s_1``."""
    rng = np.random.default_rng(1)
    q1, _ = np.linalg.qr(rng.standard_normal((M, 80)))
    q2, _ = np.linalg.qr(rng.standard_normal((80, 80)))
    a = (q1 * np.logspace(0, -12, 80)) @ q2.T
    path = tmp_path / "a.zarr"
    bl.from_array(a, path)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        res = bl.svd(path, 50, method="gram", seed=0, memory="1800KiB")
    assert not [w for w in seen if issubclass(w.category, ConvergenceWarning)]
    assert not res.report["in_core"] and res.report["converged"] is True and res.report["remeasured"] >= 1
    assert_singular_values(res.s, np.linalg.svd(a, compute_uv=False)[:50], n=M)
