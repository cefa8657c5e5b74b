"""The budget-minimum sweep: a refusal names the minimum of the whole call, and a retry at it runs.

Shared by the sweeps of issue 28 (the square solves and ``inv``, the least-squares routes of
``solve``): budgets from 16 KiB, doubling until the call runs; every refusal on the way is retried
once at exactly the ``minimum`` it carries, and each result is checked.
"""

from __future__ import annotations

from typing import Any, Callable

from blocklin.errors import BudgetError


def sweep(run: Callable[[int], Any], check: Callable[[Any], None]) -> int:
    """Run ``run(budget)`` from 16 KiB, doubling; each refusal retried at its minimum and every result
    passed to ``check``. Returns the number of refusals met (a sweep that starts below the call's
    minimum meets at least one)."""
    refusals, budget = 0, 16 << 10
    while True:
        try:
            res = run(budget)
        except BudgetError as err:
            need = err.minimum
            assert need is not None and need > budget, f"{budget}: no minimum above the budget: {err}"
            check(run(need))  # never refused again: the whole call plans at its minimum
            refusals += 1
            budget *= 2
            assert budget < 1 << 30
            continue
        check(res)
        return refusals
