"""A refusal of ``inv``, the square ``solve`` (LU, Cholesky), ``cho_solve`` and ``lu_solve`` names the
minimum of the whole call, carries it as ``.minimum``, and a retry at exactly that budget runs
(``blocklin/plan/minimum.py``): a sweep of budgets from 16 KiB doubling, each refusal retried once at
its named minimum, the result checked against NumPy (backward error ``c n eps ||A|| ||x||``).
"""

from __future__ import annotations

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
