"""A refusal of ``inv``, the square ``solve`` (LU, Cholesky), ``cho_solve`` and ``lu_solve`` names the
minimum of the whole call, carries it as ``.minimum``, and a retry at exactly that budget runs
(``blocklin/plan/minimum.py``): a sweep of budgets from 16 KiB doubling, each refusal retried once at
its named minimum, the result checked against NumPy (backward error ``c n eps ||A|| ||x||``).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.linalg
import zarr
from support.tolerances import assert_residual

import blocklin as bl
from blocklin.errors import BudgetError
from support.budgets import sweep


def _system(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n)) + np.sqrt(n) * np.eye(n)
    x = rng.standard_normal((n, n))
    return a, x @ x.T + n * np.eye(n), rng.standard_normal((n, 3))


def _calls(n: int, chunks: int | None, folder) -> dict:
    """Each call with its check; with ``chunks`` the square operands stored in chunks of that side."""
    a, p, b = _system(n)
    lu, piv = scipy.linalg.lu_factor(a)
    c = np.linalg.cholesky(p)

    def stored(name: str, x: np.ndarray):
        if chunks is None:
            return x
        arr = zarr.create_array(store=str(folder / f"{name}.zarr"), shape=x.shape, dtype=x.dtype,
                                chunks=(chunks, chunks))
        arr[...] = x
        return str(folder / f"{name}.zarr")

    sa, sp, sc, slu = stored("a", a), stored("p", p), stored("c", c), stored("lu", lu)
    kw = {"scheduler": "sync"}
    return {
        "inv": (lambda m: bl.inv(sa, memory=m, **kw), lambda x: assert_residual(a, x, np.eye(n))),
        "solve-lu": (lambda m: bl.solve(sa, b, memory=m, **kw), lambda x: assert_residual(a, x, b)),
        "solve-cholesky": (lambda m: bl.solve(sp, b, assume_a="pos", memory=m, **kw),
                           lambda x: assert_residual(p, x, b)),
        "cho_solve": (lambda m: bl.cho_solve((sc, True), b, memory=m, **kw), lambda x: assert_residual(p, x, b)),
        "lu_solve": (lambda m: bl.lu_solve((slu, piv), b, memory=m, **kw), lambda x: assert_residual(a, x, b)),
    }


@pytest.mark.parametrize("chunks", [None, 32], ids=["default-chunks", "chunks-32"])
@pytest.mark.parametrize("n", [96, pytest.param(200, marks=pytest.mark.slow)])  # the default job: n = 96
@pytest.mark.parametrize("call", ["inv", "solve-lu", "solve-cholesky", "cho_solve", "lu_solve"])
def test_named_minimum_of_the_whole_call_runs(call, n, chunks, tmp_path):
    run, check = _calls(n, chunks, tmp_path)[call]
    assert sweep(run, lambda x: check(x.to_numpy())) >= 1  # the sweep starts below every route's minimum


def test_refusal_carries_the_minimum_it_names():
    a, _, _ = _system(96)
    with pytest.raises(BudgetError) as err:
        bl.inv(a, memory="16KiB", scheduler="sync")
    assert err.value.minimum > 16 << 10 and "every step of inv" in str(err.value)
    assert isinstance(err.value.__reduce__()[1][1], int)  # kept across process boundaries


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_half_precision_solve_plans_its_gmres_products_up_front(precision, tmp_path):
    """GMRES-IR's products of a block of right-hand sides plan within the half of the budget its vectors
    leave: unplanned, a 101 x 101 solve at 102 KiB ran its factorization and was then refused naming
    42 KiB, that half's own minimum, below the budget given. It is refused before anything is written,
    naming the whole call's minimum, and runs there (backward error ``c n eps ||A|| ||x||``)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((101, 101))
    arr = zarr.create_array(store=str(tmp_path / "a.zarr"), shape=a.shape, dtype=a.dtype, chunks=(30, 70))
    arr[...] = a
    b = np.ones((101, 2))
    with pytest.raises(BudgetError) as err:
        bl.solve(str(tmp_path / "a.zarr"), b, out=tmp_path / "x.zarr", precision=precision, memory=104448)
    assert err.value.minimum > 104448
    assert not [p.name for p in tmp_path.iterdir() if "x.zarr" in p.name]  # nothing claimed nor written
    x = bl.solve(str(tmp_path / "a.zarr"), b, out=tmp_path / "x.zarr", precision=precision,
                 memory=err.value.minimum)
    assert_residual(a, x.to_numpy(), b)


@pytest.mark.parametrize("n, chunks, k, assume_a, precision", [
    (73, (50, 20), 1, "gen", "double"),   # ran at 109 KiB, refused at 218 KiB naming 429 KiB
    (39, (13, 21), 3, "pos", "double"),   # refused at 1.3x the minimum
    (106, (102, 38), 2, "gen", "fp16"),   # refused at 1.7x-3x
])
def test_every_budget_above_the_minimum_runs(n, chunks, k, assume_a, precision, tmp_path):
    """A larger budget never refuses what a smaller one runs. The refinement's products had been planned
    on square chunks of the solve's tile, which grows with the budget, while ``A`` is read at its own
    chunks: at twice a budget that ran, the product's plan no longer fit its share. They are planned on
    the stores' chunks as read now (:func:`blocklin.linalg.solve.square._product_chunks`)."""
    rng = np.random.default_rng(n)
    m = rng.standard_normal((n, n))
    a = m @ m.T + n * np.eye(n) if assume_a == "pos" else m + n * np.eye(n)
    b = rng.standard_normal((n, k))
    arr = zarr.create_array(store=str(tmp_path / "a.zarr"), shape=a.shape, dtype=a.dtype, chunks=chunks)
    arr[...] = a

    def run(memory: int):
        return bl.solve(str(tmp_path / "a.zarr"), b, assume_a=assume_a, precision=precision, memory=memory,
                        scheduler="sync")

    with pytest.raises(BudgetError) as err:
        run(16 << 10)
    least = err.value.minimum
    for factor in (1, 1.3, 1.7, 2, 3, 6):
        assert_residual(a, run(int(least * factor)).to_numpy(), b)


def test_a_stalled_mixed_solve_names_the_budget_of_its_switch_to_gmres(tmp_path):
    """``precision="mixed"`` switches to GMRES-IR where plain refinement stalls (``cond(A) = 1e9``: ``cond(A)
    u_32`` near 100). At a budget that held the solve but not the switch's vectors, the stall was refused
    with "pass precision='double'" although 1.5x the budget refines it. Now the switch is planned before
    anything is read, and the stall's refusal names the budget at which it runs, which then refines ``x``
    to the float64 backward error (checked against ``c n eps ||A|| ||x||``)."""
    rng = np.random.default_rng(0)
    n = 150
    u, _ = np.linalg.qr(rng.standard_normal((n, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    a = (u * np.logspace(0, -9, n)) @ v.T
    b = rng.standard_normal((n, 2))
    arr = zarr.create_array(store=str(tmp_path / "a.zarr"), shape=a.shape, dtype=a.dtype, chunks=(32, 32))
    arr[...] = a

    def run(memory):
        return bl.solve(str(tmp_path / "a.zarr"), b, precision="mixed", memory=memory, scheduler="sync")

    with pytest.raises(BudgetError) as least:
        run(16 << 10)
    with pytest.raises(bl.errors.ConvergenceError, match="GMRES-IR, which refines further, did not run") as stalled:
        run(least.value.minimum)
    need = re.search(r"memory='([^']+)'", str(stalled.value)).group(1)
    x = run(need)
    assert x.report["refinement"] == "plain, then gmres"
    assert_residual(a, x.to_numpy(), b)


@pytest.mark.parametrize("n, chunks, precision", [(88, (19, 85), "mixed"), (152, (60, 124), None)])
def test_every_budget_above_the_inverse_minimum_runs(n, chunks, precision, tmp_path):
    """The inverse's Newton-Schulz products are planned with the inversion on ``A``'s own chunks; where the
    working chunks a budget gives leave them too little, smaller chunks are taken. At 1.3x its minimum an
    88 x 88 ``A`` in (19, 85) chunks was refused (its working chunks grew from 16 to 64), once the products
    were planned. Each result is checked as an inverse (``||A X - I||`` within ``c n eps cond``)."""
    rng = np.random.default_rng(5)
    m = rng.standard_normal((n, n))
    a = m @ m.T + n * np.eye(n)
    arr = zarr.create_array(store=str(tmp_path / "a.zarr"), shape=a.shape, dtype=a.dtype, chunks=chunks)
    arr[...] = a

    def run(memory: int):
        return bl.inv(str(tmp_path / "a.zarr"), precision=precision, memory=memory, scheduler="sync")

    with pytest.raises(BudgetError) as err:
        run(16 << 10)
    least = err.value.minimum
    for factor in (1, 1.3, 1.7, 2, 3):
        assert_residual(a, run(int(least * factor)).to_numpy(), np.eye(n))
