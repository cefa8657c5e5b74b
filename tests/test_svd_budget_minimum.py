"""The budget an svd/pca refusal names is one that runs (docs/architecture.md: every suggested fix is
checked to work), and every pass the run may make is planned before the first one, the TSQR route
it falls back to included."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import blocklin as bl
import blocklin.linalg.center as center_mod
import blocklin.linalg.svd as svd_mod
from blocklin.errors import BudgetError


def _data(shape: tuple[int, int], dtype: str, seed: int = 0) -> np.ndarray:
    """Large column means (the centered runs' means pass matters) over a decaying spectrum."""
    m, n = shape
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, n)) * np.logspace(0, -2, n) + 100.0 * rng.standard_normal(n)
    return x.astype(dtype)


def _refusals(run, start: int) -> list[int]:
    """Two refused budgets and the minimums they name: ``start``, then just below the first minimum."""
    named = []
    budget = start
    for _ in range(2):
        with pytest.raises(BudgetError) as err:
            run(budget)
        assert err.value.minimum and err.value.minimum > budget
        named.append(err.value.minimum)
        budget = int(err.value.minimum * 0.97)
        try:
            run(budget)
            break  # 3% below the minimum runs (a rounded hint): no second refusal to take
        except BudgetError:
            pass
    return named


CASES = [c for c in itertools.product([(4000, 30), (30, 3000), (1200, 150)], ["float32", "float64"],
                                      [False, True], ["auto", "lanczos", "rsvd", "gram", "sketch"])
         if not (c[2] and c[3] == "sketch") and not (c[2] and c[3] == "gram" and c[0][0] < c[0][1])]


@pytest.mark.parametrize("shape,dtype,center,method", CASES,
                         ids=[f"{m}x{n}-{d}-{'centered' if c else 'plain'}-{meth}" for (m, n), d, c, meth in CASES])
def test_named_minimum_runs(shape, dtype, center, method):
    a = _data(shape, dtype)

    def run(memory):
        return bl.svd(a, 3, method=method, center=center, memory=memory, seed=0)

    for need in _refusals(run, 1 << 10):
        got = run(need)  # never refused again: the minimum was checked to plan every pass
        assert got.report["passes"] >= 1 and not got.report["in_core"]
        if method != "auto":
            assert got.report["method"] == method


def test_pca_centered_named_minimum_runs():
    """The case found sizing examples/pca_centered.py: large means, the Gram route or Lanczos (auto)."""
    a = _data((20000, 60), "float32")
    for need in _refusals(lambda memory: bl.pca(a, 5, memory=memory, seed=0), 1 << 10):
        assert bl.pca(a, 5, memory=need, seed=0).report["passes"] >= 1


def test_auto_refusal_names_the_method_it_planned():
    with pytest.raises(BudgetError, match=r"svd \((lanczos|gram)\)"):
        bl.svd(_data((4000, 30), "float64"), 3, center=True, memory=64 << 10, seed=0)


@pytest.fixture
def count_passes(monkeypatch):
    """Counts the passes over A that the factorization starts (svd's own and the means passes)."""
    calls = []

    def counting(real):
        def wrapper(*args, **kwargs):
            calls.append(kwargs.get("description", ""))
            return real(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(svd_mod, "run_pass", counting(svd_mod.run_pass))
    monkeypatch.setattr(center_mod, "run_pass", counting(center_mod.run_pass))
    return calls


def _graded(shape: tuple[int, int]) -> np.ndarray:
    """Column 0 is 1e201 times the others: their squares leave float64's range beside its square, so
    the Gram route, rsvd and lanczos fall back to the streaming Householder QR (report["fallback"])."""
    a = np.random.default_rng(8).standard_normal(shape)
    a[:, 0] *= 1e201
    return a


@pytest.mark.parametrize("method", ["gram", "lanczos", "rsvd"])
@pytest.mark.parametrize("shape", [(6000, 200), (20000, 60)])
def test_fallback_passes_planned_up_front(method, shape, monkeypatch, count_passes):
    a = _graded(shape)

    def refusal(memory):
        with pytest.raises(BudgetError) as err:
            bl.svd(a, 3, method=method, seed=0, memory=memory)
        return err.value.minimum

    # the budget the method's own passes fit (the fallback's not planned): the Gram route runs there...
    with monkeypatch.context() as mp:
        mp.setattr(svd_mod, "tsqr_fallback_possible", lambda *args, **kwargs: False)
        route_only = refusal(1 << 10)
    # ... but not the QR pass and the SVD of R the data makes it fall back to: refused before any pass
    need = refusal(route_only)
    assert need > route_only and count_passes == []
    got = bl.svd(a, 3, method=method, seed=0, memory=need)
    assert "tsqr" in got.report["fallback"] and count_passes
    ref = np.linalg.svd(np.ldexp(a, -700), compute_uv=False)[:3]  # scaled by a power of two: exact
    # s_1 carries column 0 (1e201), the others its rounding level; the fallback's values come from a
    # Householder QR, relative to each column (Higham Thm 19.4): s_1 to a few eps of itself
    assert abs(np.ldexp(got.s[0], -700) - ref[0]) <= 1e3 * np.finfo(np.float64).eps * ref[0]


def test_float32_never_plans_the_fallback():
    """float32's finite nonzero entries lie within 2^-277 of its largest: no column reaches 2^-511."""
    assert not svd_mod.tsqr_fallback_possible("lanczos", np.dtype("float32"), shifted=False)
    assert svd_mod.tsqr_fallback_possible("gram", np.dtype("float64"), shifted=False)
    assert not svd_mod.tsqr_fallback_possible("gram", np.dtype("float64"), shifted=True)
    assert not svd_mod.tsqr_fallback_possible("sketch", np.dtype("float64"), shifted=False)
