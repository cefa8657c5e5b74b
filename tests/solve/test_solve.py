"""blocklin.solve: Tikhonov least squares against numpy.linalg.lstsq on the augmented system [A; lam I]."""

from __future__ import annotations

import json

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import NonFiniteError, ShapeError, SingularMatrixError
from blocklin.linalg.blocks.streaming_qr import streaming_r
from support.tolerances import assert_gram, assert_solve


def ref(a, b, lam):
    n = a.shape[1]
    aa = np.vstack([a, lam * np.eye(n)])
    bb = np.vstack([b, np.zeros((n, b.shape[1]))])
    return np.linalg.lstsq(aa, bb, rcond=None)[0]


def rel(x, y):
    return np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-300)


@pytest.mark.parametrize("shape", [(700, 30), (45, 45), (25, 70)], ids=["tall", "square", "wide"])
@pytest.mark.parametrize("lam", [0.0, 0.05, 2.0])
@pytest.mark.parametrize("method", ["auto", "normal", "qr"])
def test_against_lstsq(rng, shape, lam, method):
    m, n = shape
    a = rng.standard_normal((m, n))
    b = rng.standard_normal((m, 3))
    x = bl.solve(a, b, lam=lam, method=method, memory="2MiB")
    want = ref(a, b, lam)
    assert x.shape == (n, 3)
    assert rel(x.to_numpy(), want) <= 1e-11
    r = x.report
    np.testing.assert_allclose(r["residual_norm"], np.linalg.norm(a @ want - b, axis=0), rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(r["solution_norm"], np.linalg.norm(want, axis=0), rtol=1e-9)
    assert r["lam"] == lam and r["passes"] >= 1 and r["seconds"] > 0
    if method != "auto":
        assert r["method"] == method


def test_vector_rhs_and_stored_operands(rng, tmp_path):
    a = bl.from_array(rng.standard_normal((900, 20)), tmp_path / "a.zarr", chunks=(128, 20))
    b = bl.from_array(rng.standard_normal((900, 1)), tmp_path / "b.zarr", chunks=(100, 1))
    x = bl.solve(a, b, lam=0.1, out=tmp_path / "x.zarr", memory="1MiB")
    assert x.path == str(tmp_path / "x.zarr") and x.provenance["operation"] == "solve"
    # forward error from the condition number of the regularized normal matrix (it bounds the
    # stacked least-squares problem's), for the Gram route and the reference's QR alike
    k = a.to_numpy().T @ a.to_numpy() + 0.1**2 * np.eye(20)
    assert_solve(x.to_numpy(), ref(a.to_numpy(), b.to_numpy(), 0.1), k)
    v = bl.solve(a.to_numpy(), b.to_numpy()[:, 0], lam=0.1)
    assert_solve(v.to_numpy(), x.to_numpy(), k)
    # well conditioned: "auto" skips the refinement pass; refine=1 runs it, same answer
    assert x.report["refine_steps"] == 0 and x.report["passes"] == 1
    assert x.report["residual_norm_source"] == "Gram quantities"
    y = bl.solve(a, b, lam=0.1, refine=1, memory="1MiB")
    assert y.report["refine_steps"] == 1 and y.report["passes"] == 2
    assert_solve(y.to_numpy(), x.to_numpy(), k)
    np.testing.assert_allclose(y.report["residual_norm"], x.report["residual_norm"], rtol=1e-9)


def test_ill_conditioned_auto_switches_to_qr(rng):
    m, n = 600, 25
    u, _ = np.linalg.qr(rng.standard_normal((m, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    a = (u * np.logspace(0, -9, n)) @ v.T
    xt = rng.standard_normal((n, 1))
    b = a @ xt + 1e-12 * rng.standard_normal((m, 1))
    x = bl.solve(a, b, memory="2MiB")
    assert x.report["method"] == "qr" and "ill-conditioned" in x.report["method_reason"]
    assert rel(x.to_numpy(), ref(a, b, 0.0)) <= 1e-5  # cond 1e9: the normal equations would lose everything
    assert x.report["passes"] == 2


def test_lambda_sequence_from_one_pass(rng):
    a = rng.standard_normal((400, 15))
    b = rng.standard_normal((400, 2))
    lams = [0.0, 0.3, 4.0]
    x = bl.solve(a, b, lam=lams, memory="2MiB")
    r = x.report
    # well conditioned even at lam = 0: the one-pass spectrum of A^T A (the QR route is tested in test_lambda_select.py)
    assert x.shape == (15, 6) and r["passes"] == 1 and r["method"] == "normal" and r["lam"] == lams
    for i, lam in enumerate(lams):
        want = ref(a, b, lam)
        assert rel(x.to_numpy()[:, 2 * i:2 * i + 2], want) <= 1e-11
        np.testing.assert_allclose(r["residual_norm"][i], np.linalg.norm(a @ want - b, axis=0), rtol=1e-8)


@pytest.mark.parametrize("fit_intercept", [False, True])
def test_lambda_sequence_on_an_ill_conditioned_matrix_keeps_every_direction(rng, fit_intercept):
    """A lambda list solves from the eigen-decomposition of ``A^T A``. At its rounding-level eigenvalues
    ``V^T A^T b`` is not zero but of size ``eps^(1/2) ||A|| ||b||`` (those eigenvectors mix in directions
    of ``A`` that large), and the regularized solution weighs it by ``1/lam^2``: cut there, the solution
    lost 8 digits at ``lam = ||A||`` on a matrix of condition 1e12, where the problem's condition is 1.4.
    The bound is that of the normal equations with the computed ``A^T A`` (Golub and Van Loan, 2013,
    6.1.4): ``||dx|| / ||x|| <= ||dG|| / lam^2``, ``||dG|| <= (m + n) eps ||A||^2`` for the Gram's
    rounding and the eigen-decomposition's backward error, a factor 10 for the constants; ``||A|| = 1``
    (centering only lowers it)."""
    m, n = 217, 190
    u, _ = np.linalg.qr(rng.standard_normal((m, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    a = (u * np.logspace(0, -12, n)) @ v.T
    b = rng.standard_normal((m, 2))
    lams = [1e-3, 1.0]
    x = bl.solve(a, b, lam=lams, method="normal", fit_intercept=fit_intercept, memory="2MiB")
    assert x.report["method"] == "normal" and "eigen-decomposition" in x.report["method_reason"]
    ac, bc = (a - a.mean(axis=0), b - b.mean(axis=0)) if fit_intercept else (a, b)
    for i, lam in enumerate(lams):
        want = ref(ac, bc, lam)
        assert rel(x.to_numpy()[:, 2 * i:2 * i + 2], want) <= 10 * (m + n) * np.finfo(np.float64).eps / lam**2
        np.testing.assert_allclose(x.report["solution_norm"][i], np.linalg.norm(want, axis=0), rtol=1e-9)


def test_wide_sequence_is_dual(rng):
    a = rng.standard_normal((20, 60))
    b = rng.standard_normal((20, 1))
    x = bl.solve(a, b, lam=[0.1, 1.0], memory="2MiB")
    assert x.report["orientation"] == "wide"
    for i, lam in enumerate([0.1, 1.0]):
        assert rel(x.to_numpy()[:, i:i + 1], ref(a, b, lam)) <= 1e-10


def blur_problem(rng, n=80, m=160, noise=1e-3):
    t = np.linspace(0, 1, m)[:, None]
    s = np.linspace(0, 1, n)[None, :]
    a = np.exp(-((t - s) ** 2) / (2 * 0.03**2)) / n
    grid = np.linspace(0, 1, n)
    xt = np.sin(np.pi * grid) + 0.5 * np.sin(3 * np.pi * grid)
    b0 = a @ xt
    b = b0 + noise * np.linalg.norm(b0) / np.sqrt(m) * rng.standard_normal(m)
    return a, b, xt


def test_gcv_chooses_a_sensible_lambda(rng):
    a, b, xt = blur_problem(rng)
    x = bl.solve(a, b, lam="gcv", memory="4MiB")
    r = x.report
    lams = np.logspace(-7, 0, 120)
    errs = np.array([np.linalg.norm(ref(a, b[:, None], lam)[:, 0] - xt) for lam in lams])
    best = lams[errs.argmin()]
    err = np.linalg.norm(x.to_numpy()[:, 0] - xt)
    assert best / 30 <= r["lam"] <= best * 30, (r["lam"], best)
    assert err <= 5 * errs.min()
    assert r["lam_rule"] == "gcv" and len(r["curve"]["gcv"]) == len(r["curve"]["lam"]) > 50
    # the unregularized solution is useless on this problem
    assert np.linalg.norm(ref(a, b[:, None], 0.0)[:, 0] - xt) > 20 * err


def test_lcurve_reports_corner_and_curve(rng):
    a, b, xt = blur_problem(rng)
    x = bl.solve(a, b, lam="lcurve", memory="4MiB")
    r = x.report
    assert r["lam_rule"] == "lcurve" and "curvature" in r["curve"]
    assert 1e-7 < r["lam"] < 1e-1
    assert np.linalg.norm(x.to_numpy()[:, 0] - xt) < 0.5 * np.linalg.norm(xt)


def test_streaming_r_matches_numpy(rng):
    a = rng.standard_normal((1000, 12))
    b = rng.standard_normal((1000, 2))
    sr = streaming_r(a, b, memory="1MiB")
    r = np.linalg.qr(a, mode="r")
    np.testing.assert_allclose(np.abs(sr.r), np.abs(r), atol=1e-10)
    # Householder QR: A + dA = Q R with ||dA|| <= gamma_{mn} ||A|| (Higham Thm 19.4), so R^T R is A^T A
    # to 2 ||A|| ||dA||: the Gram bound with n more in the constant
    assert_gram(sr.r.T @ sr.r, a.T @ a, a, const=2 * (a.shape[1] + 1))
    x = np.linalg.lstsq(a, b, rcond=None)[0]
    assert_solve(np.linalg.solve(sr.r, sr.qtb), x, a.T @ a)  # cond(A)^2 bounds least squares' condition
    np.testing.assert_allclose(sr.rho, np.linalg.norm(a @ x - b, axis=0), rtol=1e-9)
    assert sr.report["passes"] == 1 and sr.report["plan"]["strip"] < 1000


def test_bad_inputs(rng, tmp_path):
    a = rng.standard_normal((50, 5))
    with pytest.raises(ShapeError, match="rows"):
        bl.solve(a, rng.standard_normal((49, 1)))
    for lam in (-1.0, float("nan"), [0.1, -0.2], "sometimes"):
        with pytest.raises(ValueError, match="lam"):
            bl.solve(a, rng.standard_normal((50, 1)), lam=lam)
    with pytest.raises(ValueError, match="method"):
        bl.solve(a, rng.standard_normal((50, 1)), method="svd")
    # a wide a takes method='qr' (the dual form from A^T's R factor: tests/solve/test_qr_route_intercept_wide.py)
    assert bl.solve(rng.standard_normal((5, 50)), rng.standard_normal((5, 1)), lam=0.1, method="qr").report[
        "method"] == "qr"
    bad = a.copy()
    bad[7, 2] = np.inf
    src = bl.from_array(bad, tmp_path / "a.zarr")
    with pytest.raises(NonFiniteError, match=r"\[7, 2\]"):
        bl.solve(src, rng.standard_normal((50, 1)), out=tmp_path / "x.zarr")
    assert not (tmp_path / "x.zarr").exists()
    assert np.isinf(bl.open(tmp_path / "a.zarr")[7, 2])
    deficient = a.copy()
    deficient[:, 4] = deficient[:, 0] + deficient[:, 1]
    for method in ("auto", "normal", "qr"):
        with pytest.raises(SingularMatrixError, match="lam"):
            bl.solve(deficient, rng.standard_normal((50, 1)), method=method)
    # the same deficient problem is fine with lam > 0
    x = bl.solve(deficient, rng.standard_normal((50, 1)), lam=0.1)
    assert np.all(np.isfinite(x.to_numpy()))


@pytest.mark.slow  # a LocalCluster of its own; solve on a cluster is also checked bit for bit in test_determinism
def test_distributed_matches_local(rng):
    distributed = pytest.importorskip("distributed")
    a = rng.standard_normal((3000, 16))
    b = rng.standard_normal((3000, 2))
    local = {m: bl.solve(a, b, lam=0.2, method=m, memory="1MiB", scheduler="sync").to_numpy() for m in ("normal", "qr")}
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        for m in ("normal", "qr"):
            x = bl.solve(a, b, lam=0.2, method=m, memory="1MiB", scheduler=client)
            assert x.report["scheduler"] == "distributed"
            assert_solve(x.to_numpy(), local[m], a.T @ a + 0.2**2 * np.eye(16))


def test_cli_solve(rng, tmp_path, capsys):
    from blocklin.cli.main import main

    a, b, _ = blur_problem(rng)
    bl.from_array(a, tmp_path / "a.zarr")
    bl.from_array(b[:, None], tmp_path / "b.zarr")
    png = tmp_path / "lcurve.png"
    rc = main(["solve", str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr"), "-o", str(tmp_path / "x.zarr"),
               "--lambda", "gcv", "--plot", str(png), "--json"])
    assert rc == 0
    s = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # GCV's choice keeps A^T A + lam^2 I well conditioned: one Gram pass (+ refinement), no QR
    assert s["method"] == "normal" and s["lam"] > 0 and png.stat().st_size > 1000
    rc = main(["solve", str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr"), "-o", str(tmp_path / "y.zarr"),
               "--lambda", "1e-3", "--method", "normal", "--json"])
    assert rc == 0
    s = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert s["lam"] == 1e-3 and s["method"] == "normal" and s["passes"] == 2
    with pytest.raises(SystemExit) as info:  # a usage error, refused while parsing
        main(["solve", str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr"), "-o", str(tmp_path / "z.zarr"),
              "--lambda", "-1"])
    assert info.value.code == 2


@pytest.mark.parametrize("method", ["qr", "auto"])
def test_directions_whose_squares_underflow_in_the_scaled_problem_are_not_dropped(method):
    """Columns ``2^600`` apart and nearly collinear, ``lam`` 2.3e30: the scaled problem (divided by its
    largest entry) has a singular value and a ``lam`` both near ``1e-189``, whose squares underflowed, and
    the spectral filter dropped that direction (``x = [0, 1.5e-190]``); then, with the filters formed scaled,
    the scaled ``x`` (near ``2^626``) left float64 and the solve was refused, though the ridge solution
    ``[0.0238, -5.7e-183]`` is in range. The solution is formed as ``2^-xe x`` (``spectrum.x_exponent``).

    Reference: the normal equations in mpmath at 800 digits (``A^T A`` spans ``2^1200``). Householder QR
    (the TSQR and the SVD of ``R``) has a column-wise backward error of ``O(m n eps)`` (Higham 2002, Thm.
    19.4), so the error is bounded by the condition of the column-equilibrated augmented matrix
    ``[A D^-1; lam D^-1]`` (about 1e8 here: the columns agree to 1e-8) times that."""
    import mpmath as mp

    rng = np.random.default_rng(0)
    a = rng.standard_normal((523, 2)) + 1e8
    a[:, 1] *= 2.0 ** 600
    a *= 1e30
    b = rng.standard_normal((523, 1)) * 1e30
    lam = 2.3e30
    x = bl.solve(a, b, lam=lam, method=method)
    with mp.workdps(800):
        A, B = mp.matrix(a.tolist()), mp.matrix(b.tolist())
        g, c = A.T * A + mp.mpf(lam) ** 2 * mp.eye(2), A.T * B
        det = g[0, 0] * g[1, 1] - g[0, 1] * g[1, 0]
        ref = np.array([float((g[1, 1] * c[0] - g[0, 1] * c[1]) / det), float((g[0, 0] * c[1] - g[1, 0] * c[0]) / det)])
    d = np.abs(a).max(axis=0)  # the column scaling (norms would overflow: 1e219 squared)
    cond = np.linalg.cond(np.vstack([a / d, np.diag(lam / d)]))
    got = x.to_numpy()[:, 0]
    # componentwise in the column scaling: x_j ||a_j|| is what the column-wise bound controls
    err = np.linalg.norm((got - ref) * d) / np.linalg.norm(ref * d)
    assert err <= 10 * a.shape[0] * a.shape[1] * cond * np.finfo(float).eps, (got, ref, err)
    assert np.isclose(x.report["solution_norm"], np.linalg.norm(ref), rtol=10 * a.size * cond * np.finfo(float).eps)


def test_wide_dual_form_refuses_a_direction_whose_filter_leaves_the_range():
    """The wide analogue (rows ``2^600`` apart, ``lam`` 2.3e30): the dual form's ``1 / (s^2 + lam^2)``
    underflows along one direction; the normal route returned ``x`` near ``3e-191`` where the ridge solution
    has norm 0.077 (silently), the QR route refused naming the solution norm. Both now refuse naming lam."""
    from blocklin.errors import ParameterError

    rng = np.random.default_rng(0)
    a = rng.standard_normal((60, 2)) + 1e8
    a[:, 1] *= 2.0 ** 600
    a = (a * 1e30).T.copy()
    b = rng.standard_normal(2) * 1e30
    for method in ("auto", "qr"):
        with pytest.raises(ParameterError, match="lam: must keep s\\^2 \\+ lam\\^2 within float64"):
            bl.solve(a, b, lam=2.3e30, method=method)


def test_spectral_filters_keep_their_bits_in_range_and_their_values_beyond_it():
    """``filters`` equals the plain formulas bit for bit where no square leaves the range, and keeps the
    ratios where ``s`` and ``lam`` are both near ``1e-189`` (their squares underflow)."""
    from blocklin.linalg.solve.spectrum import filters

    rng = np.random.default_rng(1)
    s = np.abs(rng.standard_normal(50)) * 10.0 ** rng.uniform(-100, 100, 50)
    for lam in (0.0, 1e-3, 1.0, 1e40):
        sf, l2f, s2f, f = filters(s, lam)
        with np.errstate(divide="ignore"):
            plain = 1.0 / (s**2 + lam**2)
        assert np.array_equal(sf, s * plain) and np.array_equal(l2f, lam**2 * plain)
        assert np.array_equal(s2f, s**2 * plain) and np.array_equal(f, plain)
    s = np.array([3e-189, 1e-189, 0.0])
    sf, l2f, s2f, _ = filters(s, 1e-189)
    # s / (s^2 + lam^2) = (s/lam) / ((s/lam)^2 + 1) / lam; a few roundings each: 8 eps
    ref_sf = np.array([3 / 10, 1 / 2, 0.0]) / 1e-189
    assert np.allclose(sf, ref_sf, rtol=8 * np.finfo(float).eps, atol=0)
    assert np.allclose(l2f, [1 / 10, 1 / 2, 1.0], rtol=8 * np.finfo(float).eps, atol=0)
    assert np.allclose(s2f, [9 / 10, 1 / 2, 0.0], rtol=8 * np.finfo(float).eps, atol=0)


@pytest.mark.parametrize("shape", [(3, 0), (0, 3)])
@pytest.mark.parametrize("options", [[], ["--fit-intercept"], ["--lambda", "0.5"], ["--lambda", "loo"]])
def test_empty_a_refused_by_name(tmp_path, shape, options, capsys):
    # an A with no rows or no columns is refused naming a and the lstsq that solves it; the passes had
    # raised ZeroDivisionError (a traceback from the CLI) or NumPy's "unexpected array size" (no fix)
    from blocklin.cli.main import main
    from blocklin.errors import ShapeError

    a = bl.from_array(np.zeros(shape), tmp_path / "a.zarr")
    b = bl.from_array(np.ones((shape[0], 1)), tmp_path / "b.zarr")
    with pytest.raises(ShapeError, match="a: must have at least one row and one column"):
        bl.solve(np.zeros(shape), np.ones((shape[0], 1)))
    out = tmp_path / "x.zarr"
    assert main(["solve", a.path, b.path, "-o", str(out), "--no-progress", *options]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "ShapeError: a: must have at least one row" in err and "Fix: " in err, err
    assert not out.exists()
