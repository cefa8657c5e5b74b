"""The budget an svd/pca refusal names is one that runs (docs/architecture.md: every suggested fix is
checked to work): every pass a streamed run makes is planned before the first one."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import blocklin as bl
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


# The default run takes every shape, centering and method once in float32; float64 doubles them in
# the slow job (the planner's arithmetic is the same; only the itemsize changes).
_PARAMS = [pytest.param(*c, marks=[pytest.mark.slow] if c[1] == "float64" else [],
                        id=f"{c[0][0]}x{c[0][1]}-{c[1]}-{'centered' if c[2] else 'plain'}-{c[3]}") for c in CASES]


@pytest.mark.parametrize("shape,dtype,center,method", _PARAMS)
def test_named_minimum_runs(shape, dtype, center, method):
    a = _data(shape, dtype)

    def run(memory):
        return bl.svd(a, 3, method=method, center=center, memory=memory, seed=0)

    for need in _refusals(run, 1 << 10):
        got = run(need)  # never refused again: the minimum was checked to plan every pass
        assert got.report["passes"] >= 1 and not got.report["in_core"]
        if method != "auto":
            assert got.report["method"] == method


@pytest.mark.slow  # the examples' own sizes run in the slow job too
def test_pca_centered_named_minimum_runs():
    """The case found sizing examples/pca_centered.py: large means, the Gram route or Lanczos (auto)."""
    a = _data((20000, 60), "float32")
    for need in _refusals(lambda memory: bl.pca(a, 5, memory=memory, seed=0), 1 << 10):
        assert bl.pca(a, 5, memory=need, seed=0).report["passes"] >= 1


def test_auto_refusal_names_the_method_it_planned():
    with pytest.raises(BudgetError, match=r"svd \((lanczos|gram)\)"):
        bl.svd(_data((4000, 30), "float64"), 3, center=True, memory=64 << 10, seed=0)


@pytest.mark.parametrize("shape", [(20000, 400), (400, 20000)], ids=["tall", "wide"])
@pytest.mark.parametrize("method", ["lanczos", "rsvd", "sketch"])
def test_sparse_pca_named_minimum_runs(tmp_path, shape, method):
    """pca of a stored sparse matrix: its centered products are planned with the method's state before
    anything runs, so the refusal names the whole call's minimum (it named the in-core work's, then each
    product refused again with a larger one: three refusals at worst, found by a randomized search)."""
    import scipy.sparse

    x = scipy.sparse.random(*shape, density=0.02, random_state=3, format="csr")
    s = bl.from_sparse(x, tmp_path / "S.zarr", memory="9MiB")

    def run(memory):
        return bl.pca(s, 5, method=method, memory=memory, seed=0)

    with pytest.raises(BudgetError) as err:
        run(64 << 10)
    need = err.value.minimum
    assert need > 64 << 10 and "product" in str(err.value)  # the products need more than the in-core work
    got = run(need)  # never refused again
    assert got.report["passes"] >= 1


def _symmetric(n: int) -> np.ndarray:
    """Four leading eigenvalues 10..20 well apart from the rest (in -1..1)."""
    q, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((n, n)))
    a = (q * np.concatenate([np.linspace(-1, 1, n - 4), np.linspace(10, 20, 4)])) @ q.T
    return (a + a.T) / 2


@pytest.mark.parametrize("n", [80, 380])
def test_eigsh_of_staged_data_named_minimum_runs(n):
    """In-memory data is staged in the temp dir in chunks sized from the budget, and a store read by
    whole chunks (here ``memory://``) plans by them: the minimum an eigsh refusal names must plan once
    a rerun stages the copy at that budget (it had been refused again, by 0.5-4.5%)."""
    import scipy.linalg

    a = _symmetric(n)

    def run(memory):
        return bl.eigsh(a, 4, memory=memory, temp_dir="memory://blocklin-eigsh-minimum", scheduler="sync",
                        order="ascending", tol=1e-10, seed=0)

    with pytest.raises(BudgetError) as err:
        run(16 << 10)
    res = run(err.value.minimum)  # not refused again
    assert not res.report["in_core"]
    np.testing.assert_allclose(res.w, scipy.linalg.eigh(a, eigvals_only=True)[-4:], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("method", ["lanczos", "rsvd"])
def test_svd_of_staged_data_named_minimum_runs(method):
    """As for eigsh: svd of NumPy data staged in a ``memory://`` temp dir (read by whole chunks, chunked
    from the budget) runs at the minimum its refusal names (refused again, by 5.8% and 6.7%, before)."""
    a = _data((150, 150), "float64")

    def run(memory):
        return bl.svd(a, 3, method=method, memory=memory, temp_dir="memory://blocklin-svd-minimum",
                      scheduler="sync", seed=0)

    with pytest.raises(BudgetError) as err:
        run(16 << 10)
    got = run(err.value.minimum)  # not refused again
    assert not got.report["in_core"] and got.report["method"] == method
    assert got.report["passes"] >= 1
