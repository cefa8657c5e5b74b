"""The BudgetError of a sparse product names a budget at which the product runs.

A randomized search found ``matmul(S, B, trans_a=True, memory=e.minimum)`` refused again with a larger
minimum: an in-memory ``B`` is staged with chunks chosen by the budget, so at the larger budget its
chunk (counted in a task's memory) grew past the raw figure. The error's ``minimum`` is now the figure
its message names (rounded up to 64 KiB with an eighth to spare), which holds the grown chunk.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import blocklin as bl
from blocklin.errors import BudgetError


@pytest.mark.parametrize("trans", [True, False], ids=["STB", "SB"])
@pytest.mark.parametrize("shape, density, p", [((282, 193), 0.25, 3), ((150, 40), 0.3, 5), ((60, 300), 0.1, 2)])
def test_the_named_minimum_suffices(tmp_path, trans, shape, density, p):
    a = sp.random(*shape, density=density, random_state=1, format="csr")
    s = bl.from_sparse(a, tmp_path / "S.zarr")
    b = np.random.default_rng(0).standard_normal((shape[0] if trans else shape[1], p))
    with pytest.raises(BudgetError) as info:
        bl.matmul(s, b, tmp_path / "probe.zarr", trans_a=trans, memory="1KiB")
    c = bl.matmul(s, b, tmp_path / "C.zarr", trans_a=trans, memory=info.value.minimum)  # had been refused again
    want = (a.T @ b) if trans else (a @ b)
    # float64 sums of at most max(m, n) products each: tests/support/tolerances.py's product bound
    bound = 2 * max(shape) * np.finfo(np.float64).eps * (abs(a.T if trans else a) @ abs(b))
    assert np.all(np.abs(np.asarray(c.to_numpy()) - want) <= bound)
