"""The smallest budget a whole call needs: every step of it planned at one budget.

An operation of several steps plans each within the one ``memory=`` budget (some within a share of
it); a step's own refusal names what that step needs, which a later step of the same call may
refuse again. :func:`whole_call` plans every step at a budget (``plans(memory)``, pure, nothing
read or written) and, where one refuses, searches the smallest budget of the form
:func:`~blocklin.config.size_hint` prints at which all of them plan, and refuses with that: a
retry at exactly the named ``minimum`` plans every step (the rule of ``docs/architecture.md``:
every suggested fix is checked to work). The SVD's search, :mod:`blocklin.linalg.lowrank.budget`,
is the same over its passes.
"""

from __future__ import annotations

from typing import Any, Callable

from blocklin.config import format_size, parse_size, size_hint
from blocklin.errors import BudgetError, explain

#: Steps of the search (each grows the budget by at least a quarter: from 1 KiB past 10 TiB).
SEARCH_STEPS = 120


def sufficient_budget(plans: Callable[[int], Any], start: int) -> int:
    """The smallest budget of the form ``size_hint`` prints, from ``start`` up, at which ``plans`` plans."""
    need = max(1, int(start))
    for _ in range(SEARCH_STEPS):
        hint = parse_size(size_hint(need))
        try:
            plans(hint)
            return hint
        except BudgetError as again:
            need = max(hint + 1, int(again.minimum or 0), hint + hint // 4)
    return need


def whole_call(plans: Callable[[int], Any], memory: int, what: str) -> Any:
    """``plans(memory)``; where a step refuses, a :class:`BudgetError` naming (and carrying as
    ``minimum``) the smallest budget at which every step of ``what`` plans, the failing step quoted."""
    try:
        return plans(memory)
    except BudgetError as exc:
        need = sufficient_budget(plans, max(memory + 1, int(exc.minimum or 0)))
        raise BudgetError(explain(
            "memory", f"must hold every step of {what}", format_size(memory),
            f"raise it to at least {format_size(need)} (memory='{size_hint(need)}'), the least budget at which "
            f"every step plans (the step that failed: {exc})"), minimum=need) from None
