"""Lambda selection at the cheapest safe route: GCV and the L-curve against dense grid searches,
the Gram-spectrum / QR routing, grid extension at the ends, and the plots."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import blocklin as bl
from blocklin.linalg.solve.lambda_select import choose_lambda
from blocklin.linalg.solve.spectrum import Spectrum
from support.memcheck import margin, needs_hwm, run_child


def gcv_dense(a, b, lams):
    """GCV V(lam) = m ||r||^2 / (m - dof)^2 from NumPy's SVD of the dense problem."""
    u, s, _ = np.linalg.svd(a, full_matrices=False)
    beta = u.T @ b
    rho0 = np.linalg.norm(b - u @ beta) ** 2  # not ||b||^2 - ||beta||^2, which cancels
    out = []
    for lam in lams:
        f = lam**2 / (s**2 + lam**2)
        out.append(a.shape[0] * (rho0 + np.sum((f[:, None] * beta) ** 2)) / (a.shape[0] - np.sum(s**2 / (s**2 + lam**2))) ** 2)
    return np.array(out)


def problem(rng, cond, noise, m=600, n=40):
    q1, _ = np.linalg.qr(rng.standard_normal((m, n)))
    q2, _ = np.linalg.qr(rng.standard_normal((n, n)))
    a = (q1 * np.logspace(0, -np.log10(cond), n)) @ q2.T
    b = a @ rng.standard_normal(n) + noise * rng.standard_normal(m)
    return a, b


@pytest.mark.parametrize("cond,noise,method", [(1e2, 1e-1, "normal"), (1e8, 1e-9, "qr")])
def test_gcv_choice_matches_dense_grid_search(cond, noise, method):
    a, b = problem(np.random.default_rng(7), cond, noise)
    x = bl.solve(a, b, lam="gcv", memory="4MiB")
    r = x.report
    dense = np.logspace(-14, 1, 30001)
    v = gcv_dense(a, b[:, None], dense)
    best = dense[v.argmin()]
    got = gcv_dense(a, b[:, None], [r["lam"]])[0]
    assert got <= v.min() * (1 + 1e-6), (r["lam"], best)
    assert abs(np.log10(r["lam"] / best)) < 0.01
    assert r["method"] == method and r["curve"]["at_grid_end"] is None
    # the route: one Gram pass (+ refinement) when well conditioned at the choice; else one more pass (QR)
    assert (r["passes"] >= 2) if method == "qr" else ("eigen-decomposition" in r["method_reason"])
    if method == "qr":
        assert "switched to the streaming QR" in r["method_reason"]
    u, s, vt = np.linalg.svd(a, full_matrices=False)
    want = vt.T @ (s / (s**2 + r["lam"] ** 2) * (u.T @ b))  # the SVD reference (no squared condition)
    # either route is backward stable for the regularized problem, whose condition at the choice is
    # (s_1^2 + lam^2) / (s_n^2 + lam^2) <= 1e10 here: error below that times eps
    assert np.linalg.norm(x.to_numpy()[:, 0] - want) <= 1e-5 * np.linalg.norm(want)


def test_sequence_routes():
    rng = np.random.default_rng(3)
    # cond(A) = 30: A^T A has reciprocal condition 1.1e-3 at lambda = 0, well inside the route's 1e-4
    # rule (cond 1e2 put it at 1e-4 exactly, where the rounding of another BLAS kernel chose QR)
    a, b = problem(rng, 30.0, 1e-2)
    lams = [0.0, 1e-2, 1.0]
    x = bl.solve(a, b, lam=lams, memory="4MiB")
    assert x.report["method"] == "normal" and x.report["passes"] == 1
    for i, lam in enumerate(lams):
        want = np.linalg.solve(a.T @ a + lam**2 * np.eye(40), a.T @ b)
        # rcond >= 1e-3 at the smallest lambda: normal-equation error <= 1e3 eps (bounded by 1e4 eps here)
        assert np.linalg.norm(x.to_numpy()[:, i] - want) <= 1e4 * 4 * np.finfo(float).eps * np.linalg.norm(want) * 10
    a, b = problem(rng, 1e6, 1e-6)
    y = bl.solve(a, b, lam=[1e-8, 1e-3], memory="4MiB")
    assert y.report["method"] == "qr" and y.report["passes"] == 2 and "smallest lambda" in y.report["method_reason"]
    for i, lam in enumerate([1e-8, 1e-3]):
        u, s, vt = np.linalg.svd(a, full_matrices=False)
        want = vt.T @ (s / (s**2 + lam**2) * (u.T @ b))
        assert np.linalg.norm(y.to_numpy()[:, i] - want) <= 1e-9 * np.linalg.norm(want)


def _spectrum(sigma, rng, m=1000):
    s = np.logspace(0, -3, 10)
    beta = s[:, None] + sigma * rng.standard_normal((10, 1))
    return Spectrum(s=s, basis=np.eye(10), beta=beta, rho0sq=np.array([(m - 10) * sigma**2]), m=m, n=10)


def test_grid_extends_to_an_interior_minimum():
    rng = np.random.default_rng(0)
    spec = _spectrum(1e-7, rng)  # the GCV minimum near 1e-7 lies below the base grid (from 1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lam, curve = choose_lambda(spec, "gcv")
    dense = np.logspace(-16, 1, 20001)
    v = np.array([spec.gcv(t) for t in dense])
    assert curve["at_grid_end"] is None and curve["extended_decades"]["low"] > 0
    assert spec.gcv(lam) <= v.min() * (1 + 1e-9) and abs(np.log10(lam / dense[v.argmin()])) < 0.01
    lam_l, curve_l = choose_lambda(spec, "lcurve")
    assert curve_l["at_grid_end"] is None and curve_l["extended_decades"]["low"] > 0 and lam_l < 1e-4


def test_choice_at_an_end_warns():
    s = np.logspace(0, -3, 10)  # b in the range of A, no noise: GCV keeps falling as lambda -> 0
    spec = Spectrum(s=s, basis=np.eye(10), beta=np.ones((10, 1)), rho0sq=np.zeros(1), m=1000, n=10)
    with pytest.warns(bl.errors.BlocklinWarning if hasattr(bl.errors, "BlocklinWarning") else UserWarning,
                      match="low end"):
        lam, curve = choose_lambda(spec, "gcv")
    assert curve["at_grid_end"] == "low" and lam == pytest.approx(curve["lam"][0], rel=1e-3)


@pytest.mark.parametrize("rule", ["gcv", "lcurve"])
def test_plot_marks_the_choice(tmp_path, rule, capsys):
    import json

    from blocklin.cli.main import main

    a, b = problem(np.random.default_rng(5), 1e3, 1e-3)
    bl.from_array(a, tmp_path / "a.zarr")
    bl.from_array(b[:, None], tmp_path / "b.zarr")
    png = tmp_path / "curve.png"
    assert main(["solve", str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr"), "-o", str(tmp_path / "x.zarr"),
                 "--lambda", rule, "--plot", str(png), "--json", "--memory", "8MiB"]) == 0
    s = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert png.stat().st_size > 1000 and s["curve"]["chosen"] == s["lam"]


def test_decade_ticks_do_not_label_minor_ticks():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    from blocklin.cli.solve import _decade_ticks

    fig, ax = plt.subplots()
    ax.loglog([1.0, 1.5], [2.0, 2.2])  # less than a decade: matplotlib would label minor ticks
    _decade_ticks(ax)
    assert isinstance(ax.xaxis.get_minor_formatter(), NullFormatter)
    fig.canvas.draw()
    labels = [t for t in ax.xaxis.get_ticklabels(minor=True) if t.get_text()]
    assert not labels
    plt.close(fig)


LAM_CHILD = """
    import blocklin as bl
    a_path, b_path, memory = sys.argv[1:4]
    bl.open(a_path)[0:1, 0:1]
    import dask.threaded  # noqa: F401
    base = hwm()
    reset_hwm()
    x = bl.solve(a_path, b_path, lam="gcv", memory=memory)
    print(json.dumps({"baseline": base, "peak": hwm(), "method": x.report["method"]}))
"""


@needs_hwm
@pytest.mark.parametrize("cond,method", [(1e2, "normal"), (1e9, "qr")])
def test_gcv_within_the_budget_on_either_route(tmp_path, cond, method):
    rng = np.random.default_rng(2)
    m, n = 8000, 64  # A is 3.9 MiB, about twice the budget
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    a = (rng.standard_normal((m, n)) * np.logspace(0, -np.log10(cond), n)) @ q.T
    bl.from_array(a, tmp_path / "a.zarr", chunks=(512, n))
    bl.from_array(a @ rng.standard_normal(n) + 1e-8 * rng.standard_normal(m), tmp_path / "b.zarr")
    budget = 2 * 2**20
    r = run_child(LAM_CHILD, str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr"), "2MiB")
    used = r["peak"] - r["baseline"]
    assert r["method"] == method
    assert used <= budget + margin(budget), f"used {used / 2**20:.1f} MiB over baseline, budget 2 MiB"
