"""Where the Krylov bases of a sparse matrix's block Lanczos live, and its block, from the budget: in
memory where they fit beside the products, else spilled to the job's work folder
(:mod:`blocklin.linalg.lowrank.basis`) with a block the budget holds; the run and its ``--explain``
plan (:mod:`blocklin.linalg.lowrank.sparse_plan`) decide alike.

In memory the run holds ``V`` and ``W`` (``n x cap`` each) beside its products; spilled it holds a few
``n x block`` blocks (the step's ``X``, its image, the QR's work) and strip buffers
(:func:`blocklin.plan.svd.lanczos_bytes`). Where even the planned block does not fit spilled, the block
shrinks (fewer columns per step, more steps) down to :data:`MIN_SPILLED_BLOCK`; below that the call
is refused naming its minimum budget (the spilled run at that block), as every ``BudgetError`` does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from blocklin.errors import BudgetError
from blocklin.linalg.lowrank.basis import STRIP_BYTES, spilled_bytes, strip_buffer_bytes
from blocklin.linalg.lowrank.lanczos import basis_columns
from blocklin.plan.svd import default_basis, lanczos_bytes
from blocklin.runtime.sparse_pass import check_products

#: The fewest columns a spilled run's step takes when the budget shrinks its block: below this block
#: Lanczos needs many more steps (each a pass over ``S``) and misses clustered eigenvalues more easily.
MIN_SPILLED_BLOCK = 4
#: Spill the bases where they do not fit the budget (the tests switch it off to see the refusal).
SPILL = True


@dataclasses.dataclass(frozen=True)
class BasisPlan:
    """The bases' place and the block of one run.

    ``reserved``: what the method holds beside its products (the bases or their strip buffers, the
    step's work, plus the caller's ``extra``); ``need``: its largest product (``X``, the result, one
    task); ``basis_bytes``: the bases ``V`` and ``W`` (on disk where ``spilled``, else in memory)."""

    spilled: bool
    block: int
    max_basis: int
    cap: int
    reserved: int
    need: int
    basis_bytes: int

    def report(self) -> dict:
        """What the run's report says of its bases."""
        return {"basis_spilled": self.spilled, "basis_bytes": self.basis_bytes}


def plan_bases(n: int, k: int, *, block: int, max_basis: int | None, block_given: bool, store: Any,
               products: Callable[[int], list[tuple[int, bool]]], item: int, dtype: Any, budget: int,
               extra: Callable[[int, int, bool], int], spill_ok: bool, itemsize: int = 8,
               try_memory: bool = True) -> BasisPlan:
    """The :class:`BasisPlan` of a Lanczos run of ``k`` pairs on an ``n``-long space whose products with
    the stored sparse ``store`` are ``products(block)`` (``(columns, transposed)`` each, ``X`` of ``item``
    bytes an element; :func:`~blocklin.runtime.sparse_pass.check_products`); ``extra(block, cap, spilled)``:
    what the caller holds besides (a Laplacian's degrees, a Rayleigh-Ritz step's blocks).

    ``block`` is the planned one; unless ``block_given``, a spilled run may take fewer columns (down to
    :data:`MIN_SPILLED_BLOCK`). ``spill_ok``: whether the job can spill (a local work folder);
    ``try_memory=False``: the caller's own in-memory plan was refused (svd's), only the spilled one is sized.

    Raises
    ------
    BudgetError
        Where neither fits: the in-memory refusal where spilling is off, else the spilled one at the
        smallest block, naming that whole call's minimum.
    """

    def basis_of(b: int) -> int:
        return max_basis or max(k + b, min(default_basis(k, 10, b), n))  # as plan_svd

    def sized(b: int, spilled: bool) -> tuple[int, int, int]:
        mb = basis_of(b)
        cap = basis_columns(n, k, b, mb)
        strip = strip_buffer_bytes(n, cap, itemsize)
        return mb, cap, lanczos_bytes(n, k, b, cap, spilled=spilled, strip_bytes=strip, itemsize=itemsize) \
            + extra(b, cap, spilled)

    mb, cap, reserved = sized(block, False)
    in_memory = None
    try:
        if try_memory:
            need = check_products(store, products(block), item, dtype, budget, reserved)
            return BasisPlan(False, block, mb, cap, reserved, need, spilled_bytes(n, cap, itemsize))
    except BudgetError as exc:
        if not (spill_ok and SPILL):
            raise
        in_memory = exc
    widths = [block] if block_given else list(range(block, min(block, MIN_SPILLED_BLOCK) - 1, -1))
    for b in widths:
        mb, cap, reserved = sized(b, True)
        need = check_products(store, products(b), item, dtype, 1 << 62)
        if reserved + need <= budget:
            return BasisPlan(True, b, mb, cap, reserved, need, spilled_bytes(n, cap, itemsize))
    b = widths[-1]
    mb, cap, reserved = sized(b, True)
    try:
        check_products(store, products(b), item, dtype, budget, reserved)  # raises, naming this minimum
    except BudgetError as spilled:  # the whole call's minimum: the smaller (a small basis is cheaper in memory)
        raise (in_memory if in_memory is not None and (in_memory.minimum or 0) <= (spilled.minimum or 0)
               else spilled) from None
    raise AssertionError("unreachable: the spilled plan did not fit and was not refused")  # pragma: no cover


__all__ = ["BasisPlan", "MIN_SPILLED_BLOCK", "SPILL", "STRIP_BYTES", "plan_bases"]
